defmodule Heft do
  @moduledoc "Heft: an ETS-like table whose records live off the BEAM heap."
end
