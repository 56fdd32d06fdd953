defmodule Heft.Memory.Tables do
  # Every ETS table and every Heft table of a node, as maps in bytes.
  #
  # ETS: :ets.info/1 gives memory in words; bytes = words * wordsize of the
  # node that owns the table (8 on a 64-bit VM). A table that is deleted
  # between :ets.all/0 and :ets.info/1 answers :undefined and is skipped.
  #
  # Heft: only when the Heft module there exports all/0 (until then, and on
  # a node without Heft, the list is nil: unavailable, not empty). Heft.info/1
  # already speaks in bytes; its keyword list is kept whole as a map.
  @moduledoc false

  alias Heft.Memory.Source

  # Owner pid -> registered name (or nil), so the report can say who owns a
  # table. One lookup per distinct owner.
  def ets(source, word_size) do
    tables =
      for t <- Source.call(source, :ets, :all, []),
          info = Source.call(source, :ets, :info, [t]),
          is_list(info) do
        words = info[:memory]

        %{
          id: t,
          name: info[:name],
          owner: info[:owner],
          size: info[:size],
          type: info[:type],
          compressed: info[:compressed],
          words: words,
          bytes: words * word_size
        }
      end

    names = owner_names(source, tables)

    tables
    |> Enum.map(&Map.put(&1, :owner_name, names[&1.owner]))
    |> Enum.sort_by(&{-&1.bytes, inspect(&1.name)})
  end

  def heft(source) do
    if heft_available?(source) do
      tables =
        for t <- Source.call(source, Heft, :all, []),
            info = Source.call(source, Heft, :info, [t]),
            is_list(info) do
          info |> Map.new() |> Map.put(:id, t)
        end

      names = owner_names(source, tables)

      tables
      |> Enum.map(&Map.put(&1, :owner_name, names[&1[:owner]]))
      |> Enum.sort_by(&{-(&1[:memory] || 0), inspect(&1[:name])})
    end
  end

  def heft_available?(%Source{heft?: false}), do: false
  def heft_available?(source), do: Source.exported?(source, Heft, :all, 0)

  defp owner_names(source, tables) do
    for pid <- tables |> Enum.map(& &1[:owner]) |> Enum.uniq(), is_pid(pid), into: %{} do
      name =
        case Source.call(source, :erlang, :process_info, [pid, :registered_name]) do
          {:registered_name, n} when is_atom(n) -> n
          _ -> nil
        end

      {pid, name}
    end
  end
end
