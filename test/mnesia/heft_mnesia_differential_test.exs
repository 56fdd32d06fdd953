defmodule Heft.MnesiaDifferentialTest do
  # The same random sequence of Mnesia operations (in transactions and
  # async_dirty: read, write, delete, delete_object, iteration, select/4
  # with continuations, index_read, dirty update_counter) against one
  # table of each storage, disc_copies being the reference, comparing
  # every result. Seeds are printed on failure.
  use ExUnit.Case, async: false

  alias Heft.Test.MnesiaNode

  @moduletag :mnesia
  @moduletag :tmp_dir
  @moduletag :capture_log

  @storages [:disc_copies, :heft_copies, :heft_ram_copies]
  @keys 40
  @ops 400

  setup %{tmp_dir: dir} do
    :ok = MnesiaNode.start(Path.join(dir, "mnesia"))
    on_exit(fn -> :mnesia.stop() end)
    :ok
  end

  for type <- [:set, :ordered_set, :bag], ix <- [:ordered, :bag] do
    test "#{type}, #{ix} index: heft_copies and heft_ram_copies answer every operation as disc_copies" do
      type = unquote(type)

      seed =
        case System.get_env("HEFT_MNESIA_SEED") do
          nil -> :erlang.phash2({type, unquote(ix), System.unique_integer()})
          s -> String.to_integer(s)
        end

      :rand.seed(:exsss, seed)

      tabs =
        for s <- @storages do
          tab = :"diff_#{type}_#{unquote(ix)}_#{s}"

          {:atomic, :ok} =
            :mnesia.create_table(tab, [
              {s, [node()]},
              {:type, type},
              {:attributes, [:k, :v]},
              {:index, [{:v, unquote(ix)}]}
            ])

          tab
        end

      for n <- 1..@ops do
        op = op(type)
        if System.get_env("HEFT_MNESIA_TRACE"), do: IO.inspect({n, op})
        [reference | others] = for tab <- tabs, do: run(op, tab, type)

        for {result, tab} <- Enum.zip(others, tl(tabs)) do
          assert result == reference,
                 "seed #{seed}, op #{n} #{inspect(op)}: #{tab} answered #{inspect(result)}, " <>
                   "disc_copies #{inspect(reference)}"
        end
      end

      [reference | others] = for tab <- tabs, do: run({:trans, :all}, tab, type)
      for result <- others, do: assert(result == reference)
    end
  end

  defp op(type) do
    k = :rand.uniform(@keys)
    # Values equal but not exactly (1 and 1.0), also inside tuples: an
    # ordered index's keys {V, K} compare them equal, its reads
    # ({{V, '$1'}}, partly bound) must tell them apart as ETS does. Not
    # in a bag: there disc_copies itself (OTP 25) loses the index entry of
    # {K, 1.0} when {K, 1} is written beside it (its index_read of 1.0
    # then misses a record the table holds), where Heft's keeps both.
    values = [1, 2, 3, {1, :a}, [1 | 2]]
    v = Enum.random(if type == :bag, do: values, else: [1.0, 2.0, {1.0, :a} | values])
    ctx = Enum.random([:trans, :dirty])

    case :rand.uniform(if type == :bag, do: 10, else: 11) do
      1 -> {ctx, {:write, k, v}}
      2 -> {ctx, {:write, k, v}}
      3 -> {ctx, {:delete, k}}
      4 -> {ctx, {:read, k}}
      5 -> {ctx, {:delete_object, k, v}}
      6 -> {ctx, {:index_read, v}}
      7 -> {ctx, {:select, v, :rand.uniform(7)}}
      8 -> {ctx, :keys}
      9 -> {ctx, {:write_many, for(i <- 1..5, do: {:rand.uniform(@keys), i})}}
      10 -> {ctx, {:match, v}}
      11 -> {:counter, k, Enum.random([1, 3, -2])}
    end
  end

  defp run({:counter, k, incr}, tab, _type), do: :mnesia.dirty_update_counter(tab, k, incr)

  defp run({ctx, op}, tab, type) do
    f = fn -> normal(order(type, op), act(op, tab)) end

    case ctx do
      :trans -> :mnesia.transaction(f)
      :dirty -> {:atomic, :mnesia.async_dirty(f)}
    end
  end

  defp act({:write, k, v}, tab), do: :mnesia.write({tab, k, v})

  defp act({:write_many, kvs}, tab),
    do: Enum.each(kvs, fn {k, v} -> :mnesia.write({tab, k, v}) end)

  defp act({:delete, k}, tab), do: :mnesia.delete({tab, k})
  defp act({:delete_object, k, v}, tab), do: :mnesia.delete_object({tab, k, v})
  defp act({:read, k}, tab), do: strip(:mnesia.read(tab, k))
  defp act({:index_read, v}, tab), do: strip(:mnesia.index_read(tab, v, :v))
  defp act({:match, v}, tab), do: strip(:mnesia.match_object({tab, :_, v}))
  defp act(:keys, tab), do: :mnesia.all_keys(tab)
  defp act(:all, tab), do: strip(:mnesia.match_object({tab, :_, :_}))

  defp act({:select, v, limit}, tab) do
    spec = [{{tab, :"$1", :"$2"}, [{:"/=", :"$2", {:const, v}}], [{{:"$1", :"$2"}}]}]

    Stream.unfold(:mnesia.select(tab, spec, limit, :read), fn
      :"$end_of_table" -> nil
      {results, cont} -> {results, :mnesia.select(cont)}
    end)
    |> Enum.concat()
  end

  # What an index finds comes in the index's order, not the table's.
  defp order(_type, {:index_read, _}), do: :bag
  defp order(_type, {:match, _}), do: :bag
  defp order(type, _op), do: type

  defp strip(records), do: Enum.map(records, fn {_tab, k, v} -> {k, v} end)

  # disc_copies is ETS: without an order (set, bag), results are compared
  # sorted; an ordered_set's results must come in the same order.
  defp normal(:ordered_set, result), do: result
  defp normal(_, result) when is_list(result), do: Enum.sort(result)
  defp normal(_, result), do: result
end
