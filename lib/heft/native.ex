defmodule Heft.Native do
  # The NIF stubs. Every function here is replaced by Rust code from
  # native/heft_nif when the module loads; the bodies below only run if the
  # library failed to load.
  @moduledoc false
  @on_load :load_nif

  def load_nif do
    path = :filename.join(:code.priv_dir(:heft), ~c"native/libheft_nif")
    :erlang.load_nif(path, 0)
  end

  defp nif_error, do: :erlang.nif_error(:heft_nif_not_loaded)

  def core_version, do: nif_error()
end
