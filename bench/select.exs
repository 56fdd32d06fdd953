# Match-specification benchmarks, standalone:
#
#     mix run bench/select.exs                 # 1,000,000 records
#     mix run bench/select.exs --records 100000
#     mix run bench/select.exs --only realistic,mixed   # sections 5 and 6
#
# Measures, on the same records in an ETS set and a Heft set:
#   1. select by a bound key against lookup (Heft should be the same order);
#   2. a full-table select_count against ETS's, for a
#      spec that must look at every object and for the trivial spec that
#      Heft answers from the table's size;
#   3. the memory a full select needs: the peak growth of the selecting
#      process's memory and of the VM's total while it walks the table,
#      against tab2list (which holds every object) for scale;
#   4. key ranges of an ordered_set: a partly bound key and a guard range
#      on the key, each selecting 1,000 records, against lookup;
#   5. full-table select, select_count and select_delete over 100,000
#      records with 0-1,499-byte values;
#   6. a mixed load: 100 and 1,000 processes on one :public table, one
#      call in five a full-table select, the others short calls.
# Times are medians of a few runs (wall clock, this machine, whatever else
# is running on it); memory is sampled every millisecond by another
# process.

defmodule Heft.Bench.Select do
  @moduledoc false

  def main(argv) do
    {opts, _, _} = OptionParser.parse(argv, strict: [records: :integer, only: :string])
    n = Keyword.get(opts, :records, 1_000_000)

    case opts[:only] do
      nil -> all(n)
      only -> for s <- String.split(only, ","), do: section(s, n)
    end
  end

  defp section("realistic", n), do: realistic(min(n, 100_000))
  defp section("mixed", _n), do: mixed()

  defp all(n) do
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
    realistic(min(n, 100_000))
    mixed()
  end

  # 5. Records of realistic size, {{:rec, k}, k, <0-1,499 random bytes>}:
  # full-table select, select_count and select_delete with a guard that
  # keeps 9 records, on the key and on another element. ETS and Heft are
  # alternated, 5 runs each; median and spread.
  defp realistic(n) do
    IO.puts("\n## 5. #{fmt(n)} records of 0-1,499 bytes (ms: median [min-max] of 5)\n")
    IO.puts("| call | ETS | Heft | Heft/ETS |\n| --- | ---: | ---: | ---: |")
    :rand.seed(:exsss, {5, 5, 5})
    recs = for k <- 1..n, do: {{:rec, k}, k, :crypto.strong_rand_bytes(:rand.uniform(1500) - 1)}
    e = :ets.new(:bench_realistic, [:public])
    h = Heft.new(:bench_realistic, [:public])
    :ets.insert(e, recs)
    Heft.insert(h, recs)
    on_key = [{{{:rec, :"$1"}, :_, :_}, [{:<, :"$1", 10}], [:"$_"]}]
    on_elem = [{{:_, :"$1", :_}, [{:<, :"$1", 10}], [:"$_"]}]
    count = fn [{head, guards, _}] -> [{head, guards, [true]}] end
    # select_delete's records go back after each run, untimed.
    deleted = Enum.take(recs, 9)

    for {label, call} <- [
          {"select, guard on the key", &select(&1, &2, on_key)},
          {"select, guard on element 2", &select(&1, &2, on_elem)},
          {"select_count, guard on the key", &select_count(&1, &2, count.(on_key))},
          {"select_count, guard on element 2", &select_count(&1, &2, count.(on_elem))},
          {"select_delete, guard on element 2", &delete_back(&1, &2, count.(on_elem), deleted)}
        ] do
      {ets, heft} = alternated(5, fn -> call.(:ets, e) end, fn -> call.(Heft, h) end)
      IO.puts("| #{label} | #{spread(ets)} | #{spread(heft)} | #{ratio(ets, heft)} |")
    end

    :ets.delete(e)
    Heft.delete(h)
  end

  defp select(mod, tab, spec), do: mod.select(tab, spec)
  defp select_count(mod, tab, spec), do: mod.select_count(tab, spec)

  defp delete_back(mod, tab, spec, deleted) do
    {us, 9} = :timer.tc(fn -> mod.select_delete(tab, spec) end)
    mod.insert(tab, deleted)
    {:us, us}
  end

  # 6. The mixed workload: `procs` processes each make 200 calls on one
  # :public set of ~7,000 records of 0-1,499 bytes, one call in five a
  # select with a guard (the others insert, lookup, delete, update_counter).
  # Wall time for all of them, the p99 of the calls that are not selects,
  # and the slowest call of all (a process waiting for the scheduler counts
  # in its call's time), ETS and Heft alternated, 5 runs each.
  defp mixed do
    for procs <- [100, 1000] do
      IO.puts("\n## 6. mixed load, #{procs} processes x 200 calls (median [min-max] of 5)\n")

      IO.puts(
        "| store | wall ms | p99 of other calls, µs | slowest call, ms |\n| --- | ---: | ---: | ---: |"
      )

      {ets, heft} =
        alternated(5, fn -> mixed_run(:ets, procs) end, fn -> mixed_run(Heft, procs) end, & &1)

      for {label, runs} <- [{"ETS", ets}, {"Heft", heft}] do
        walls = Enum.map(runs, &elem(&1, 0))
        p99s = Enum.map(runs, &elem(&1, 1))
        slowest = Enum.map(runs, &elem(&1, 2))
        IO.puts("| #{label} | #{spread(walls)} | #{spread(p99s)} | #{spread(slowest)} |")
      end
    end
  end

  defp mixed_run(mod, procs) do
    :rand.seed(:exsss, {6, 6, procs})
    tab = if mod == :ets, do: :ets.new(:mixed, [:public]), else: Heft.new(:mixed, [:public])
    blob = fn -> :crypto.strong_rand_bytes(:rand.uniform(1500) - 1) end
    mod.insert(tab, for(k <- 1..7_000, do: {k, 0, blob.()}))
    spec = [{{:"$1", :_, :_}, [{:<, :"$1", 10}], [:"$1"]}]
    parent = self()
    t0 = System.monotonic_time(:microsecond)

    pids =
      for p <- 1..procs do
        spawn_link(fn ->
          :rand.seed(:exsss, {p, 7, 7})

          times =
            for i <- 1..200, reduce: [] do
              acc ->
                k = :rand.uniform(7_000)

                case rem(i, 5) do
                  0 ->
                    {us, _} = :timer.tc(fn -> mod.select(tab, spec) end)
                    [{:select, us} | acc]

                  r ->
                    {us, _} = :timer.tc(fn -> other_call(mod, tab, r, k) end)
                    [{:other, us} | acc]
                end
            end

          send(parent, {:times, self(), times})
        end)
      end

    times = Enum.flat_map(pids, fn pid -> receive(do: ({:times, ^pid, t} -> t)) end)
    wall = (System.monotonic_time(:microsecond) - t0) / 1000
    if mod == :ets, do: :ets.delete(tab), else: Heft.delete(tab)
    sorted = Enum.sort(for {:other, us} <- times, do: us)
    slowest = times |> Enum.map(&elem(&1, 1)) |> Enum.max()
    {wall, Enum.at(sorted, div(length(sorted) * 99, 100)), slowest / 1000}
  end

  defp other_call(mod, tab, 1, k), do: mod.insert(tab, {k, 0, "x"})
  defp other_call(mod, tab, 2, k), do: mod.lookup(tab, k)
  defp other_call(mod, tab, 3, k), do: mod.delete(tab, k + 7_000)
  defp other_call(mod, tab, 4, k), do: mod.update_counter(tab, k, {2, 1}, {k, 0, ""})

  # Runs each `runs` times, alternating; each run's result through
  # `measure` (default: its wall time in ms, or the µs it reports).
  defp alternated(runs, a, b, measure \\ nil) do
    time = fn f ->
      case :timer.tc(f) do
        {_us, {:us, us}} -> us / 1000
        {us, result} -> if measure, do: measure.(result), else: us / 1000
      end
    end

    _ = {a.(), b.()}
    pairs = for _ <- 1..runs, do: {time.(a), time.(b)}
    {Enum.map(pairs, &elem(&1, 0)), Enum.map(pairs, &elem(&1, 1))}
  end

  defp median(xs), do: xs |> Enum.sort() |> Enum.at(div(length(xs), 2))

  defp spread(xs),
    do: "#{ms(median(xs) * 1.0)} [#{ms(Enum.min(xs) * 1.0)}-#{ms(Enum.max(xs) * 1.0)}]"

  defp ratio(ets, heft),
    do: :erlang.float_to_binary(median(heft) / median(ets), decimals: 2) <> "x"

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
