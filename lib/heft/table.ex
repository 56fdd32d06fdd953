defmodule Heft.Table do
  @moduledoc """
  The identifier of a Heft table created without `:named_table`, as
  returned by `Heft.new/2` (ETS returns a reference there).

  It is opaque: pass it to `Heft` functions. Two identifiers are equal when
  they refer to the same table. A named table is identified by its name
  instead, as in ETS; `Heft.whereis/1` gives the identifier of a named
  table.
  """

  @enforce_keys [:name, :ref]
  defstruct [:name, :ref]

  @type t :: %__MODULE__{name: atom, ref: reference}

  defimpl Inspect do
    def inspect(%Heft.Table{name: name, ref: ref}, _opts) do
      "#Heft.Table<" <> Kernel.inspect(name) <> ", " <> Kernel.inspect(ref) <> ">"
    end
  end
end
