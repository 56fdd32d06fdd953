# Insert and lookup latency while a table trains a dictionary and
# re-compresses 1M records in the background, against the same table left
# alone: training should never block a scheduler for more than about 1 ms
# and never stop writers.
#
#   mix run bench/dictionary_training.exs [records] [rounds]
#
# A {:zstd, dictionary: :auto} set is filled with `records` (default
# 1,000,000) JSON-like map records (~200 bytes encoded; its own automatic
# training runs during the fill and is waited for). Then, `rounds` times
# (default 5), interleaved: a quiet window, where one process inserts a
# record (overwriting one, so that the table keeps its size) and looks
# another up in a loop, timing each call; and a training
# window, where Heft.train_dictionary/2 trains a new dictionary and the
# background job re-compresses every record while the same loop runs,
# until re-compression is done. The quiet window lasts as long as the
# last training window. Reports p50/p99/p99.9/max per window, medians over
# rounds with their spread (min..max), and the load average.
[records, rounds] =
  case System.argv() do
    [n, r] -> [String.to_integer(n), String.to_integer(r)]
    [n] -> [String.to_integer(n), 5]
    [] -> [1_000_000, 5]
  end

Code.require_file("dictionary_support.exs", __DIR__)
json = &BenchDictionary.json_map/1

settle = &BenchDictionary.settle/1

t = Heft.new(:bench_train, [:public, compression: {:zstd, dictionary: :auto}])

{fill_us, _} =
  :timer.tc(fn ->
    Enum.each(
      Enum.chunk_every(1..records, 1000),
      &Heft.insert(t, for(i <- &1, do: {i, json.(i)}))
    )

    settle.(t)
  end)

IO.puts(
  "filled #{records} records in #{div(fill_us, 1000)} ms; #{inspect(Heft.info(t, :dictionaries))}"
)

IO.puts("stored #{Float.round(Heft.info(t, :payload_stored_bytes) / records, 1)} B/record")

# Latencies go to histograms (:counters, no garbage): 1 µs buckets below
# 1 ms, 100 µs buckets up to 1 s.
buckets = 1000 + 10_000

bucket = fn us ->
  if us < 1000, do: us + 1, else: min(1000 + div(us - 1000, 100), buckets - 1) + 1
end

value = fn b -> if b <= 1000, do: b - 1, else: 1000 + (b - 1001) * 100 end

# One process: insert a new key, look an old one up, until `stop.()`;
# returns the next key.
loop = fn k0, stop, ins_h, look_h ->
  Stream.iterate(k0, &(&1 + 1))
  |> Enum.find(fn k ->
    if stop.() do
      true
    else
      # Overwrites: the table keeps its size.
      w = rem(k, records) + 1
      {ins, true} = :timer.tc(fn -> Heft.insert(t, {w, json.(w)}) end)
      {look, [_]} = :timer.tc(fn -> Heft.lookup(t, rem(k * 7919, records) + 1) end)
      :counters.add(ins_h, bucket.(ins), 1)
      :counters.add(look_h, bucket.(look), 1)
      false
    end
  end)
end

stats_of = fn h ->
  counts = for b <- 1..buckets, do: :counters.get(h, b)
  n = Enum.sum(counts)

  at = fn p ->
    target = max(1, ceil(n * p))

    counts
    |> Enum.with_index(1)
    |> Enum.reduce_while(0, fn {c, b}, acc ->
      if acc + c >= target, do: {:halt, value.(b)}, else: {:cont, acc + c}
    end)
  end

  %{n: n, p50: at.(0.5), p99: at.(0.99), p999: at.(0.999), max: at.(1.0)}
end

next = :counters.new(1, [])
:counters.put(next, 1, records + 1)

run = fn stop ->
  {ins_h, look_h} = {:counters.new(buckets, []), :counters.new(buckets, [])}
  k = loop.(:counters.get(next, 1), stop, ins_h, look_h)
  :counters.put(next, 1, k)
  %{insert: stats_of.(ins_h), lookup: stats_of.(look_h)}
end

IO.puts("load before: #{String.trim(elem(System.cmd("uptime", []), 0))}")

results =
  for round <- 1..rounds do
    # Training window first, so that the quiet one can last as long.
    started = System.monotonic_time(:millisecond)
    finished = :atomics.new(1, [])

    # Once train_dictionary/2 has returned, re-compression is :running
    # until it is :done; the trainer polls (every 10 ms) so that the timed
    # loop only reads a flag, as in the quiet window.
    trainer =
      Task.async(fn ->
        r = Heft.train_dictionary(t)
        settle.(t)
        :atomics.put(finished, 1, 1)
        r
      end)

    busy = run.(fn -> :atomics.get(finished, 1) == 1 end)

    {:ok, id} = Task.await(trainer, :infinity)
    ms = System.monotonic_time(:millisecond) - started
    tr = Heft.info(t, :training)
    rc = Heft.info(t, :recompression)
    deadline = System.monotonic_time(:millisecond) + ms
    quiet = run.(fn -> System.monotonic_time(:millisecond) >= deadline end)

    IO.puts(
      "round #{round}: dictionary #{id} trained in #{div(tr.microseconds, 1000)} ms, " <>
        "#{rc.recompressed}/#{rc.total} re-compressed, window #{ms} ms; " <>
        "insert p99 #{busy.insert.p99} vs #{quiet.insert.p99} µs (max #{busy.insert.max} vs #{quiet.insert.max}); " <>
        "lookup p99 #{busy.lookup.p99} vs #{quiet.lookup.p99} µs"
    )

    {busy, quiet, ms}
  end

IO.puts("load after: #{String.trim(elem(System.cmd("uptime", []), 0))}")

median = fn xs -> xs |> Enum.sort() |> Enum.at(div(length(xs), 2)) end
spread = fn xs -> "#{median.(xs)} (#{Enum.min(xs)}..#{Enum.max(xs)})" end

IO.puts("\nmedians over #{rounds} rounds (spread), µs:")

for op <- [:insert, :lookup], m <- [:p50, :p99, :p999, :max] do
  b = Enum.map(results, fn {busy, _, _} -> busy[op][m] end)
  q = Enum.map(results, fn {_, quiet, _} -> quiet[op][m] end)
  IO.puts("  #{op} #{m}: training #{spread.(b)}  quiet #{spread.(q)}")
end

IO.puts("  window ms: #{spread.(Enum.map(results, &elem(&1, 2)))}")
