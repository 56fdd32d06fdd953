# Match-specification benchmarks (issue 3), standalone:
#
#     mix run bench/select.exs                 # 1,000,000 records
#     mix run bench/select.exs --records 100000
#
# Measures, on the same records in an ETS set and a Heft set:
#   1. select by a bound key against lookup (Heft should be the same order);
#   2. a full-table select_count against ETS's (goal: at most 3x ETS), for a
#      spec that must look at every object and for the trivial spec that
#      Heft answers from the table's size;
#   3. the memory a full select needs: the peak growth of the selecting
#      process's memory and of the VM's total while it walks the table,
#      against tab2list (which holds every object) for scale;
#   4. key ranges of an ordered_set: a partly bound key and a guard range
#      on the key, each selecting 1,000 records, against lookup.
# Times are medians of a few runs (wall clock, this machine, whatever else
# is running on it); memory is sampled every millisecond by another
# process.

defmodule Heft.Bench.Select do
  @moduledoc false

  def main(argv) do
    {opts, _, _} = OptionParser.parse(argv, strict: [records: :integer])
    n = Keyword.get(opts, :records, 1_000_000)
    IO.puts("# select benchmarks, #{fmt(n)} records {i, {:user, i}, rem(i, 100), name}\n")
    {e, h} = load(n)

    keys = for _ <- 1..20_000, do: :rand.uniform(n)
    IO.puts("## 1. bound key vs lookup (µs per call, 20,000 random keys)\n")
    IO.puts("| call | ETS | Heft |\n| --- | ---: | ---: |")
    row("lookup(k)", per_call(keys, &:ets.lookup(e, &1)), per_call(keys, &Heft.lookup(h, &1)))

    sel = fn mod, tab -> &mod.select(tab, [{{&1, :_, :_, :_}, [], [:"$_"]}]) end
    row("select {k, _, _, _}", per_call(keys, sel.(:ets, e)), per_call(keys, sel.(Heft, h)))

    pinned = fn mod, tab ->
      &mod.select(tab, [{{:"$1", :_, :_, :"$2"}, [{:==, :"$1", &1}], [:"$2"]}])
    end

    # ETS scans the whole table for a key pinned by a guard: 20 calls do.
    row(
      "select guard `k == K`",
      per_call(Enum.take(keys, 20), pinned.(:ets, e)),
      per_call(keys, pinned.(Heft, h))
    )

    IO.puts("\n## 2. full-table select_count (ms, median of 3)\n")
    IO.puts("| spec | ETS | Heft | Heft/ETS |\n| --- | ---: | ---: | ---: |")

    for {label, spec} <- [
          {"`{_, _, 7, _}` -> true (scan)", [{{:_, :_, 7, :_}, [], [true]}]},
          {"`{I, _, _, _}` when I > N/2 (scan)",
           [{{:"$1", :_, :_, :_}, [{:>, :"$1", div(n, 2)}], [true]}]},
          {"`_` -> true (size)", [{:_, [], [true]}]}
        ] do
      ets = median_ms(fn -> :ets.select_count(e, spec) end)
      heft = median_ms(fn -> Heft.select_count(h, spec) end)
      ratio = if ets > 0, do: :erlang.float_to_binary(heft / ets, decimals: 1), else: "-"
      IO.puts("| #{label} | #{ms(ets)} | #{ms(heft)} | #{ratio}x |")
    end

    IO.puts("\n## 3. memory while walking the whole table (peak growth, bytes)\n")
    IO.puts("| walk | results | selecting process | VM total |\n| --- | ---: | ---: | ---: |")
    none = [{{:_, :_, 1000, :_}, [], [:"$_"]}]
    some = [{{:_, :_, 7, :_}, [], [:"$_"]}]

    for {label, fun} <- [
          {"Heft.select, no match", fn -> Heft.select(h, none) end},
          {"Heft.select, 1% match", fn -> Heft.select(h, some) end},
          {"Heft.select_count, scan", fn -> Heft.select_count(h, some) end},
          {"Heft.tab2list (for scale)", fn -> Heft.tab2list(h) end},
          {":ets.select, no match", fn -> :ets.select(e, none) end}
        ] do
      {results, proc, total} = peak_memory(fun)
      IO.puts("| #{label} | #{fmt(results)} | #{fmt(proc)} | #{fmt(total)} |")
    end

    :ets.delete(e)
    Heft.delete(h)
    ordered_ranges(n)
  end

  # 4. An ordered_set keyed {g, i} with 1,000 keys a group g: a partly
  # bound key `{g, _}` and a guard range on the key variable select one
  # group, walked as a key range (ETS walks the prefix as well; it scans
  # the table for the guard range, so it gets fewer calls).
  defp ordered_ranges(n) do
    groups = max(div(n, 1000), 1)
    IO.puts("\n## 4. ordered_set key ranges (µs per call, #{fmt(min(n, 1000))} results each)\n")
    IO.puts("| call | ETS | Heft |\n| --- | ---: | ---: |")
    e = :ets.new(:bench_ordered, [:ordered_set, :public])
    h = Heft.new(:bench_ordered, [:ordered_set, :public])

    1..n
    |> Stream.chunk_every(10_000)
    |> Enum.each(fn is ->
      batch = for i <- is, do: {{rem(i, groups), i}, {:user, i}, rem(i, 100), "name #{i}"}
      :ets.insert(e, batch)
      Heft.insert(h, batch)
    end)

    gs = for _ <- 1..200, do: :rand.uniform(groups) - 1
    keys = for _ <- 1..20_000, i = :rand.uniform(n), do: {rem(i, groups), i}

    row(
      "lookup({g, i})",
      per_call(keys, &:ets.lookup(e, &1)),
      per_call(keys, &Heft.lookup(h, &1))
    )

    prefix = fn mod, tab -> &mod.select(tab, [{{{&1, :_}, :_, :_, :_}, [], [:"$_"]}]) end

    row(
      "select `{{g, _}, _, _, _}`",
      per_call(gs, prefix.(:ets, e)),
      per_call(gs, prefix.(Heft, h))
    )

    guarded = fn mod, tab ->
      fn g ->
        guard = [{:>=, :"$1", {:const, {g, 0}}}, {:<, :"$1", {:const, {g + 1, 0}}}]
        mod.select(tab, [{{:"$1", :_, :_, :_}, guard, [:"$_"]}])
      end
    end

    row(
      "select `{K, ...}` when {g, 0} =< K < {g + 1, 0}",
      per_call(Enum.take(gs, 5), guarded.(:ets, e)),
      per_call(gs, guarded.(Heft, h))
    )
  end

  defp load(n) do
    e = :ets.new(:bench_select, [:public])
    h = Heft.new(:bench_select, [:public])

    1..n
    |> Stream.chunk_every(10_000)
    |> Enum.each(fn is ->
      batch = for i <- is, do: {i, {:user, i}, rem(i, 100), "name #{i}"}
      :ets.insert(e, batch)
      Heft.insert(h, batch)
    end)

    {e, h}
  end

  defp per_call(keys, fun) do
    {us, _} = :timer.tc(fn -> Enum.each(keys, fun) end)
    us / length(keys)
  end

  defp median_ms(fun) do
    fun.()

    for(_ <- 1..3, do: elem(:timer.tc(fun), 0) / 1000)
    |> Enum.sort()
    |> Enum.at(1)
  end

  # Runs `fun` in a fresh process while a sampler watches that process's
  # memory and the VM's total; returns {results, peak process growth, peak
  # total growth}.
  defp peak_memory(fun) do
    :erlang.garbage_collect()
    parent = self()

    worker =
      spawn(fn ->
        receive do
          :go -> :ok
        end

        result = fun.()
        send(parent, {:done, if(is_list(result), do: length(result), else: result)})
      end)

    Process.sleep(10)
    base_proc = proc_memory(worker)
    base_total = :erlang.memory(:total)
    sampler = spawn_link(fn -> sample(worker, base_proc, base_total, {0, 0}) end)
    send(worker, :go)

    receive do
      {:done, results} ->
        send(sampler, {:stop, self()})

        receive do
          {:peak, proc, total} -> {results, proc, total}
        end
    end
  end

  defp sample(worker, base_proc, base_total, {p, t}) do
    peak = {max(p, proc_memory(worker) - base_proc), max(t, :erlang.memory(:total) - base_total)}

    receive do
      {:stop, from} -> send(from, {:peak, elem(peak, 0), elem(peak, 1)})
    after
      1 -> sample(worker, base_proc, base_total, peak)
    end
  end

  defp proc_memory(pid) do
    case Process.info(pid, :memory) do
      {:memory, m} -> m
      nil -> 0
    end
  end

  defp row(label, ets, heft),
    do:
      IO.puts(
        "| #{label} | #{:erlang.float_to_binary(ets, decimals: 2)} | #{:erlang.float_to_binary(heft, decimals: 2)} |"
      )

  defp ms(x), do: :erlang.float_to_binary(x, decimals: 1)

  defp fmt(n) when is_integer(n),
    do: n |> Integer.to_string() |> String.replace(~r/\B(?=(\d{3})+(?!\d))/, ",")

  defp fmt(other), do: inspect(other)
end

Heft.Bench.Select.main(System.argv())
