defmodule Heft.Table do
  @moduledoc """
  The identifier of a Heft table created without `:named_table`, as
  returned by `Heft.new/2` (ETS returns a reference there).

  It is opaque: pass it to `Heft` functions. Two identifiers are equal when
  they refer to the same table. A named table is identified by its name
  instead, as in ETS; `Heft.whereis/1` gives the identifier of a named
  table.
  """

  @enforce_keys [:ref]
  defstruct [:ref]

  @type t :: %__MODULE__{ref: reference}

  defimpl Inspect do
    # Shows the table's current name (it can change with Heft.rename/2), or
    # that it has been deleted.
    def inspect(%Heft.Table{ref: ref} = tab, _opts) do
      name =
        case Heft.info(tab, :name) do
          :undefined -> "deleted"
          name -> Kernel.inspect(name)
        end

      "#Heft.Table<" <> name <> ", " <> Kernel.inspect(ref) <> ">"
    end
  end
end
