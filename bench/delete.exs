# Deletion-order and bag-batch benchmarks (issue 9, section 1), standalone:
#
#     mix run bench/delete.exs                 # 1,000,000 records, 5 runs
#     mix run bench/delete.exs --records 100000 --runs 7
#
# Each case runs on the same objects in an ETS table and a Heft table of the
# same type, Heft and ETS taking turns (which goes first alternates), each
# run on a table built afresh outside the timed part. Times are wall-clock
# medians with the min–max over the runs; the load average is printed at
# the start and the end (this machine is shared: read the spread).
#
#   1. select_delete(t, [{:_, [], [true]}]) and match_delete(t, {:_, :_}) of
#      every record of a set and a bag, and a select_delete whose guard must
#      look at each object (the general path, on a tenth of the records);
#   2. first-then-delete and next-then-delete loops over 200,000 records;
#   3. 20,000 deletes in walk order against the same in random order;
#   4. a list of 1,000,000 objects `{i}` inserted into a bag in one call;
#   5. the longest single normal-scheduler `delete/2` NIF call while deleting
#      every record in walk order (resizes of a large index go to a dirty
#      scheduler), and the longest whole `Heft.delete/2`.

Code.require_file("harness.exs", __DIR__)

defmodule Heft.Bench.Delete do
  @moduledoc false

  def main(argv) do
    {opts, _, _} = OptionParser.parse(argv, strict: [records: :integer, runs: :integer])
    n = Keyword.get(opts, :records, 1_000_000)
    runs = Keyword.get(opts, :runs, 5)
    IO.puts("# delete benchmarks: #{fmt(n)} records, #{runs} runs, #{load()}\n")
    IO.puts("| case | ETS ms | Heft ms | Heft/ETS |\n| --- | ---: | ---: | ---: |")

    pairs = fn count -> for i <- 1..count, do: {i, i} end

    for type <- [:set, :bag] do
      compare("select_delete `_ -> true`, #{fmt(n)}, #{type}", runs, table(type, pairs.(n)), fn
        mod, t -> mod.select_delete(t, [{:_, [], [true]}])
      end)

      compare("match_delete `{_, _}`, #{fmt(n)}, #{type}", runs, table(type, pairs.(n)), fn
        mod, t -> mod.match_delete(t, {:_, :_})
      end)
    end

    tenth = div(n, 10)

    compare(
      "select_delete `{K, _}` when K > 0 (general), #{fmt(tenth)}, set",
      runs,
      table(:set, pairs.(tenth)),
      fn mod, t -> mod.select_delete(t, [{{:"$1", :_}, [{:>, :"$1", 0}], [true]}]) end
    )

    loops = min(n, 200_000)

    compare("first-then-delete loop, #{fmt(loops)}, set", runs, table(:set, pairs.(loops)), fn
      mod, t -> first_delete(mod, t, mod.first(t))
    end)

    compare("next-then-delete loop, #{fmt(loops)}, set", runs, table(:set, pairs.(loops)), fn
      mod, t -> next_delete(mod, t, mod.first(t))
    end)

    few = min(n, 20_000)

    for {order, label} <- [walk: "walk order", random: "random order"] do
      setup = fn mod ->
        t = table(:set, pairs.(few)).(mod)
        keys = walk_keys(mod, t, mod.first(t), [])
        {t, if(order == :walk, do: keys, else: Enum.shuffle(keys))}
      end

      compare("#{fmt(few)} deletes in #{label}, set", runs, setup, fn mod, {t, keys} ->
        Enum.each(keys, &mod.delete(t, &1))
      end)
    end

    objects = for i <- 1..n, do: {i}

    compare("insert a list of #{fmt(n)} `{i}`, bag", runs, table(:bag, []), fn mod, t ->
      mod.insert(t, objects)
    end)

    IO.puts("\n#{load()}\n")
    longest_delete(n)
  end

  # A setup: a fresh table of `type` holding `objects`, for either module.
  defp table(type, objects) do
    fn mod ->
      t = mod.new(:bench_delete, [type, :public])
      objects |> Enum.chunk_every(10_000) |> Enum.each(&mod.insert(t, &1))
      t
    end
  end

  defp first_delete(_mod, _t, :"$end_of_table"), do: :ok

  defp first_delete(mod, t, k) do
    mod.delete(t, k)
    first_delete(mod, t, mod.first(t))
  end

  defp next_delete(_mod, _t, :"$end_of_table"), do: :ok

  defp next_delete(mod, t, k) do
    next = mod.next(t, k)
    mod.delete(t, k)
    next_delete(mod, t, next)
  end

  defp walk_keys(_mod, _t, :"$end_of_table", acc), do: Enum.reverse(acc)
  defp walk_keys(mod, t, k, acc), do: walk_keys(mod, t, mod.next(t, k), [k | acc])

  # Runs `op` on a fresh setup `runs` times for each store, interleaved.
  defp compare(label, runs, setup, op) do
    times =
      for run <- 1..runs, mod <- if(rem(run, 2) == 0, do: [Heft, :ets], else: [:ets, Heft]) do
        state = setup.(mod)
        :erlang.garbage_collect()
        {us, _} = :timer.tc(fn -> op.(mod, state) end)
        drop(mod, state)
        {mod, us / 1000}
      end

    ets = for {:ets, ms} <- times, do: ms
    heft = for {Heft, ms} <- times, do: ms
    ratio = median(heft) / max(median(ets), 0.001)
    ratio = if ratio < 0.1, do: Float.round(ratio, 3), else: Float.round(ratio, 1)
    IO.puts("| #{label} | #{spread(ets)} | #{spread(heft)} | #{ratio}x |")
  end

  defp drop(mod, {t, _keys}), do: drop(mod, t)
  defp drop(mod, t), do: mod.delete(t)

  # 5. Deletes every record of a set in walk order through the NIFs,
  # timing each normal-scheduler call and each whole Heft.delete/2.
  defp longest_delete(n) do
    t = table(:set, for(i <- 1..n, do: {i, i})).(Heft)
    keys = walk_keys(Heft, t, Heft.first(t), [])

    {normal, whole} =
      Enum.reduce(keys, {[], []}, fn k, {normal, whole} ->
        {us, answer} = :timer.tc(fn -> Heft.Native.delete_key(t.ref, k) end)

        case answer do
          :"$heft_cpu" ->
            {all, true} = :timer.tc(fn -> Heft.delete(t, k) end)
            {[us | normal], [us + all | whole]}

          true ->
            {[us | normal], whole}
        end
      end)

    sorted = Enum.sort(normal, :desc)
    over = Enum.count(sorted, &(&1 > 1000))
    p9999 = Enum.at(sorted, div(length(sorted), 10_000))

    IO.puts("""
    Deleting #{fmt(n)} records of a set in walk order, one delete/2 each:
    normal-scheduler NIF calls: longest #{Float.round(hd(sorted) / 1000, 3)} ms, 99.99th
    percentile #{Float.round(p9999 / 1000, 3)} ms, #{over} over 1 ms (wall clock: a
    call the OS preempts counts its wait); #{length(whole)} calls handed to
    DirtyCpu (index resizes), the longest whole Heft.delete/2 of those
    #{Float.round(Enum.max(whole, fn -> 0 end) / 1000, 1)} ms.
    """)

    Heft.delete(t)
  end

  defp median(xs), do: xs |> Enum.sort() |> Enum.at(div(length(xs), 2))

  defp spread(xs) do
    "#{ms(median(xs))} (#{ms(Enum.min(xs))}–#{ms(Enum.max(xs))})"
  end

  defp ms(x) when x >= 100, do: :erlang.float_to_binary(x, decimals: 0)
  defp ms(x) when x >= 10, do: :erlang.float_to_binary(x, decimals: 1)
  defp ms(x), do: :erlang.float_to_binary(x, decimals: 2)

  defp load do
    [one, five, fifteen | _] = File.read!("/proc/loadavg") |> String.split()
    "load average #{one}, #{five}, #{fifteen} (#{System.schedulers_online()} schedulers)"
  end

  defp fmt(n), do: Heft.Bench.Report.int(n)
end

Heft.Bench.Delete.main(System.argv())
