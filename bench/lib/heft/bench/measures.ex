defmodule Heft.Bench.Measures do
  # The measures of `mix bench` that are not a cell of the matrix (issue
  # 11), each comparing Heft with its defaults against ETS at 1,000,000
  # small map records `{i, %{id: i, name: "user-#{i}", age: rem(i, 90)}}`:
  #
  # - mixed: 2 reader processes look up random keys while 1 writer process
  #   overwrites random keys (ETS: a `read_concurrency: true` set; Heft: a
  #   set with its defaults). Reads/s of both readers together, p50/p99
  #   read latency from every 64th read (timed with
  #   :erlang.monotonic_time/0, so the other 63 run untimed), writes/s.
  # - ordered: random lookups in an ordered_set of 1,000,000 keys (Heft
  #   ordered_set against ETS ordered_set), records inserted in random key
  #   order; µs per lookup and the table's bytes per record.
  #
  # Each run is a fresh OS process (Heft.Bench.Cell runs it); runs of the
  # stores alternate (Heft, ETS, ETS, Heft, ...) `runs` times (default 5),
  # and each figure is the median with min–max. The Heft/ETS ratio is the
  # median of the ratios of the runs taken side by side. With `--ab DIR`
  # a third store, "heft_b", runs the same measure with the NIF of DIR
  # (a build directory holding lib/heft/priv/native/libheft_nif.so).
  @moduledoc false

  alias Heft.Bench.{Kinds, Report}

  @names [:mixed, :ordered]
  @keys 65_536
  @sample_every 64
  @check_every 1_024
  @lookup_ms 2_000
  @lookups 200_000

  # Metric, title, unit, shown per measure.
  @metrics %{
    mixed: [
      {:reads_per_s, "reads/s", ""},
      {:p50_us, "read p50 µs", ""},
      {:p99_us, "read p99 µs", ""},
      {:writes_per_s, "writes/s", ""}
    ],
    ordered: [
      {:lookup_us, "lookup µs/op", ""},
      {:bytes, "bytes/rec (store)", ""}
    ]
  }

  # Goal per measure: metric, how Heft compares, target, its text.
  @goals %{
    mixed: {:reads_per_s, :at_least, 0.8, "mixed 2 readers + 1 writer: reads/s vs ETS"},
    ordered: {:lookup_us, :at_most, 1.5, "ordered_set lookup µs/op vs ETS"}
  }

  def names, do: @names

  def describe(:mixed),
    do:
      "2 readers (random lookups) and 1 writer (random overwrites), " <>
        "small map records; ETS `read_concurrency: true`"

  def describe(:ordered),
    do: "ordered_set lookups of random keys, small map records inserted in random key order"

  ## Parent side

  # Runs each measure `runs` times per store, stores interleaved; returns
  # the measure results (see aggregate/3).
  def run(opts, spawn) do
    for name <- opts.measures do
      stores = ["heft", "ets"] ++ if(opts[:ab], do: ["heft_b"], else: [])

      results =
        for rep <- 1..opts.measure_runs,
            store <- if(rem(rep, 2) == 1, do: stores, else: Enum.reverse(stores)),
            reduce: %{} do
          acc ->
            spec = %{
              measure: name,
              store: store,
              count: opts.measure_count,
              seconds: opts.mixed_seconds,
              rep: rep
            }

            spec = if store == "heft_b", do: Map.put(spec, :build, opts.ab), else: spec
            label = "#{name} · #{store} · #{Report.int(spec.count)} records · run #{rep}"
            Map.update(acc, store, [spawn.(spec, label)], &(&1 ++ [spawn.(spec, label)]))
        end

      result = aggregate(name, opts.measure_count, results)
      IO.puts(markdown([result]))
      result
    end
  end

  # %{measure, count, status, stores: %{store => stats}, ratios: %{store =>
  # stat}}: the stats of each store's runs (median, min, max per metric)
  # and the ratio Heft/ETS of the goal's metric, run by run.
  def aggregate(name, count, results) do
    failed = results |> Map.values() |> List.flatten() |> Enum.find(&(&1.status != :ok))

    case failed do
      nil ->
        {metric, _, _, _} = @goals[name]
        ets = Enum.map(results["ets"], & &1[metric])

        ratios =
          for {store, runs} <- results, store != "ets", into: %{} do
            each =
              runs |> Enum.map(& &1[metric]) |> Enum.zip(ets) |> Enum.map(fn {h, e} -> h / e end)

            {store, Report.stat(each)}
          end

        stores =
          for {store, runs} <- results, into: %{} do
            {store,
             Map.new(@metrics[name], fn {m, _, _} -> {m, Report.stat(Enum.map(runs, & &1[m]))} end)}
          end

        %{
          measure: name,
          count: count,
          status: :ok,
          runs: length(results["ets"]),
          stores: stores,
          ratios: ratios
        }

      failed ->
        %{measure: name, count: count, status: :error, reason: failed.reason}
    end
  end

  # A Markdown section per measure: a row per store, then the goal.
  def markdown(results) do
    Enum.map_join(results, "\n", fn r ->
      title = "## #{r.measure}: #{describe(r.measure)}, #{Report.int(r.count)} records\n"

      case r.status do
        :ok ->
          metrics = @metrics[r.measure]
          titles = ["store", "runs" | Enum.map(metrics, &elem(&1, 1))] ++ ["ratio vs ETS"]

          rows =
            for store <- store_order(r.stores) do
              stats = r.stores[store]
              figures = Enum.map(metrics, fn {m, _, _} -> figure(stats[m]) end)
              ratio = if store == "ets", do: "–", else: figure(r.ratios[store])
              "| " <> Enum.join([store, "#{r.runs}" | figures] ++ [ratio], " | ") <> " |"
            end

          Enum.join(
            [
              title,
              "| " <> Enum.join(titles, " | ") <> " |",
              "|" <> String.duplicate("---|", length(titles)) | rows
            ],
            "\n"
          ) <> "\n\n" <> goal_line(r) <> "\n"

        _ ->
          title <> "\nfailed: #{r.reason}\n"
      end
    end)
  end

  defp store_order(stores), do: Enum.filter(["heft", "heft_b", "ets"], &Map.has_key?(stores, &1))

  defp figure(nil), do: "–"
  defp figure({m, lo, hi}), do: "#{Report.num(m)} (#{Report.num(lo)}–#{Report.num(hi)})"

  # The goal's verdict from the median ratio of Heft's own runs.
  def goal(%{status: :ok} = r) do
    {metric, how, target, text} = @goals[r.measure]
    {ratio, _, _} = r.ratios["heft"]
    met = if how == :at_least, do: ratio >= target, else: ratio <= target
    %{goal: text, metric: metric, ratio: ratio, target: target, how: how, met: met}
  end

  def goal(_), do: nil

  defp goal_line(r) do
    g = goal(r)
    sign = if g.how == :at_least, do: "≥", else: "≤"
    verdict = if g.met, do: "met", else: "**MISSED**"

    "Goal: #{g.goal} #{sign} #{g.target}: ratio #{Report.num(g.ratio)} " <>
      "(median of the runs side by side), #{verdict}."
  end

  # The goals' rows for the goals table of results.md.
  def goals_markdown(results) do
    rows =
      for r <- results, g = goal(r), g != nil do
        sign = if g.how == :at_least, do: "≥", else: "≤"
        verdict = if g.met, do: "met", else: "**MISSED**"
        "| #{g.goal} | heft | #{Report.num(g.ratio)} | #{sign} #{g.target} | #{verdict} |"
      end

    Enum.join(
      [
        "## Goals of the other measures (median ratio Heft / ETS of the runs side by side)\n",
        "| goal | store | ratio | target | result |",
        "|---|---|---|---|---|" | rows
      ],
      "\n"
    ) <> "\n"
  end

  # Long format: one line per measure, store and metric.
  def csv(results) do
    rows =
      for %{status: :ok} = r <- results,
          store <- store_order(r.stores),
          {m, {med, lo, hi}} <-
            Enum.map(@metrics[r.measure], fn {m, _, _} -> {m, r.stores[store][m]} end) ++
              if(r.ratios[store], do: [{:ratio_vs_ets, r.ratios[store]}], else: []) do
        Enum.join([r.measure, store, r.count, r.runs, m, num(med), num(lo), num(hi)], ",")
      end

    Enum.join(["measure,store,records,runs,metric,median,min,max" | rows], "\n") <> "\n"
  end

  defp num(x) when is_integer(x), do: Integer.to_string(x)
  defp num(x), do: :erlang.float_to_binary(x / 1, [:compact, decimals: 6])

  ## Child side (in the fresh OS process)

  def child(%{measure: :mixed, store: store, count: n, seconds: seconds}) do
    {mod, t} = open(store, [:set], n)
    fill(mod, t, Enum.to_list(1..n))
    mixed(mod, t, n, seconds)
  end

  def child(%{measure: :ordered, store: store, count: n}) do
    {mod, t} = open(store, [:ordered_set], n)
    fill(mod, t, Enum.shuffle(1..n))
    bytes = memory(mod, t)
    keys = for _ <- 1..@lookups, do: :rand.uniform(n)
    check!(mod, t, Enum.take(keys, 100))
    lookups(mod, t, Enum.take(keys, 1_000), 0)
    {done, native} = timed_lookups(mod, t, Enum.chunk_every(keys, 1_000), 0, 0)
    %{status: :ok, lookup_us: us(native) / done, bytes: bytes / n}
  end

  defp open("ets", type, _n),
    do: {:ets, :ets.new(:bench, type ++ [:public, read_concurrency: true])}

  defp open(_heft, type, _n), do: {Heft, Heft.new(:bench, type ++ [:public])}

  defp memory(:ets, t), do: :ets.info(t, :memory) * :erlang.system_info(:wordsize)
  defp memory(Heft, t), do: Heft.info(t, :memory)

  defp fill(mod, t, keys) do
    keys
    |> Stream.chunk_every(1_000)
    |> Enum.each(fn chunk -> mod.insert(t, Enum.map(chunk, &Kinds.record(:small_map, &1))) end)
  end

  defp check!(mod, t, keys) do
    for k <- keys,
        mod.lookup(t, k) != [Kinds.record(:small_map, k)],
        do: raise("lookup(#{k}) returned #{inspect(mod.lookup(t, k), limit: 5)}")
  end

  defp lookups(_mod, _t, [], _), do: :ok

  defp lookups(mod, t, [k | rest], acc) do
    mod.lookup(t, k)
    lookups(mod, t, rest, acc)
  end

  defp timed_lookups(_mod, _t, [], done, native), do: {done, native}

  defp timed_lookups(mod, t, [keys | rest], done, native) do
    t0 = now()
    lookups(mod, t, keys, 0)
    native = native + now() - t0
    done = done + length(keys)

    if us(native) > @lookup_ms * 1000,
      do: {done, native},
      else: timed_lookups(mod, t, rest, done, native)
  end

  defp mixed(mod, t, n, seconds) do
    check!(mod, t, for(_ <- 1..100, do: :rand.uniform(n)))
    stop = :atomics.new(1, [])
    parent = self()
    keys = fn -> List.to_tuple(for _ <- 1..@keys, do: :rand.uniform(n)) end

    # The writer's records: random keys, new ages; built before the start.
    writes =
      List.to_tuple(
        for _ <- 1..@keys do
          {k, v} = Kinds.record(:small_map, :rand.uniform(n))
          {k, %{v | age: rem(v.age + 1, 90)}}
        end
      )

    readers =
      for _ <- 1..2 do
        ks = keys.()
        spawn_link(fn -> go(parent, fn -> reader(mod, t, ks, stop) end) end)
      end

    writer = spawn_link(fn -> go(parent, fn -> writer(mod, t, writes, stop, 0, 0) end) end)
    all = [writer | readers]
    for p <- all, do: receive(do: ({:ready, ^p} -> :ok))
    for p <- all, do: send(p, :go)
    Process.sleep(round(seconds * 1000))
    :atomics.put(stop, 1, 1)
    results = for p <- all, do: receive(do: ({:done, ^p, r} -> r))
    [{:writer, writes_done, w_native} | reads] = results
    samples = reads |> Enum.flat_map(fn {:reader, _, _, s} -> s end) |> Enum.sort()

    %{
      status: :ok,
      reads_per_s:
        Enum.reduce(reads, 0, fn {:reader, done, native, _}, acc ->
          acc + done / (us(native) / 1.0e6)
        end),
      writes_per_s: writes_done / (us(w_native) / 1.0e6),
      p50_us: percentile(samples, 0.50),
      p99_us: percentile(samples, 0.99),
      samples: length(samples)
    }
  end

  defp go(parent, fun) do
    send(parent, {:ready, self()})
    receive(do: (:go -> :ok))
    t0 = now()
    result = fun.()
    send(parent, {:done, self(), put_elem(result, 2, now() - t0)})
  end

  defp percentile([], _), do: nil

  defp percentile(sorted, p) do
    i = min(length(sorted) - 1, max(0, ceil(p * length(sorted)) - 1))
    us(Enum.at(sorted, i))
  end

  # {:reader, reads, _, samples}: reads in steps of @sample_every, the last
  # of each timed; the stop flag is read every @check_every reads.
  defp reader(mod, t, keys, stop), do: read(mod, t, keys, stop, 0, [])

  defp read(mod, t, keys, stop, done, samples) do
    if rem(done, @check_every) == 0 and :atomics.get(stop, 1) == 1 do
      {:reader, done, 0, samples}
    else
      untimed(mod, t, keys, done, @sample_every - 1)
      k = elem(keys, rem(done + @sample_every - 1, @keys))
      t0 = :erlang.monotonic_time()
      mod.lookup(t, k)
      sample = :erlang.monotonic_time() - t0
      read(mod, t, keys, stop, done + @sample_every, [sample | samples])
    end
  end

  defp untimed(_mod, _t, _keys, _i, 0), do: :ok

  defp untimed(mod, t, keys, i, left) do
    mod.lookup(t, elem(keys, rem(i, @keys)))
    untimed(mod, t, keys, i + 1, left - 1)
  end

  defp writer(mod, t, writes, stop, i, done) do
    if rem(done, @check_every) == 0 and :atomics.get(stop, 1) == 1 do
      {:writer, done, 0}
    else
      mod.insert(t, elem(writes, rem(i, @keys)))
      writer(mod, t, writes, stop, i + 1, done + 1)
    end
  end

  defp now, do: :erlang.monotonic_time()
  defp us(native), do: :erlang.convert_time_unit(native, :native, :nanosecond) / 1000
end
