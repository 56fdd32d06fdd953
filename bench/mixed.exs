# Latency of readers and a writer while a table churns and compacts, next
# to ETS with the same work in the same VM.
#
#     mix run bench/mixed.exs                       # 1,000,000 records, 10 s, 5 runs
#     mix run bench/mixed.exs --records 200000 --seconds 3 --runs 1
#
# A `:public` set is loaded with `{i, %{id: i, name: "user-i", blob:
# <0-199 bytes>}}`. Then for `seconds` two reader processes look up random
# keys (some deleted by then) and one writer process deletes a random key
# of the first `records` and inserts a new key with a larger blob
# (200-399 bytes), in turns, as fast as they can: the freed blocks are
# too small for the new records, so free space grows; for Heft a fourth
# process runs `Heft.compact/1` over and over, 10 ms apart (on demand:
# the worst case for the others), so the table is compacting all along (the
# compactions, automatic ones included, and the longest they held the
# table's lock are printed). Every call is timed (monotonic clock, ns)
# into a histogram of 1 µs buckets up to 100 ms; printed: calls, p50,
# p99, p99.9 and the largest, per role. Heft and ETS take turns, the
# order alternating between runs; medians over the runs with the spread
# (min-max).
Code.require_file("harness.exs", __DIR__)

defmodule Heft.Bench.Mixed do
  @moduledoc false
  alias Heft.Bench.Sys

  @switches [records: :integer, seconds: :integer, runs: :integer]
  # Histogram buckets: 1 µs each, the last one for everything slower.
  @buckets 100_000

  def main(argv) do
    {opts, _, _} = OptionParser.parse(argv, strict: @switches)
    n = Keyword.get(opts, :records, 1_000_000)
    seconds = Keyword.get(opts, :seconds, 10)
    runs = Keyword.get(opts, :runs, 5)

    IO.puts(
      "# mixed: #{n} records, 2 readers and 1 writer for #{seconds} s, #{runs} runs " <>
        "(#{Sys.context()})\n"
    )

    IO.puts(
      "| run | store | role | calls | p50 µs | p99 µs | p99.9 µs | max µs | compactions | longest lock hold µs |"
    )

    IO.puts("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")

    rows =
      for run <- 1..runs, store <- order(run), role_row <- once(store, n, seconds) do
        row = Map.put(role_row, :run, run)
        print(row)
        row
      end

    IO.puts("\nMedians (min-max) over #{runs} runs:\n")
    IO.puts("| store | role | p50 µs | p99 µs | p99.9 µs | max µs |")
    IO.puts("|---|---|---|---|---|---|")

    for store <- [:heft, :ets], role <- [:reader, :writer] do
      rs = Enum.filter(rows, &(&1.store == store and &1.role == role))
      cells = for k <- [:p50, :p99, :p999, :max], do: spread(Enum.map(rs, &Map.fetch!(&1, k)))
      IO.puts("| #{store} | #{role} | #{Enum.join(cells, " | ")} |")
    end
  end

  defp order(run), do: if(rem(run, 2) == 1, do: [:heft, :ets], else: [:ets, :heft])

  defp record(i, extra),
    do:
      {i,
       %{id: i, name: "user-#{i}", blob: :binary.copy(<<rem(i, 251)>>, rem(i * 31, 200) + extra)}}

  defp once(store, n, seconds) do
    t = new(store)

    for chunk <- Enum.chunk_every(1..n, 1000),
        do: insert(store, t, Enum.map(chunk, &record(&1, 0)))

    before = compaction(store, t)
    stop = System.monotonic_time(:millisecond) + seconds * 1000
    parent = self()

    roles = [
      {:reader, fn h -> reader(store, t, n, stop, h) end},
      {:reader, fn h -> reader(store, t, n, stop, h) end},
      {:writer, fn h -> writer(store, t, n, stop, h, n + 1) end}
    ]

    compactor = if store == :heft, do: spawn_link(fn -> compact_until(t, stop) end)

    pids =
      for {role, f} <- roles do
        spawn_link(fn ->
          # The histogram, then the longest call (µs) in slot @buckets + 1.
          h = :atomics.new(@buckets + 1, signed: false)
          calls = f.(h)
          send(parent, {:done, self(), role, calls, h})
        end)
      end

    results =
      for pid <- pids, do: receive(do: ({:done, ^pid, role, calls, h} -> {role, calls, h}))

    if compactor, do: send(compactor, {:stop, self()}) && receive(do: (:compactor_done -> :ok))

    after_ = compaction(store, t)
    delete(store, t)

    for role <- [:reader, :writer] do
      mine = for {^role, calls, h} <- results, do: {calls, h}
      calls = mine |> Enum.map(&elem(&1, 0)) |> Enum.sum()
      counts = merged(Enum.map(mine, &elem(&1, 1)))
      longest = mine |> Enum.map(&:atomics.get(elem(&1, 1), @buckets + 1)) |> Enum.max()

      %{
        store: store,
        role: role,
        calls: calls,
        p50: percentile(counts, calls, 0.5),
        p99: percentile(counts, calls, 0.99),
        p999: percentile(counts, calls, 0.999),
        max: longest,
        compactions: after_.runs - before.runs,
        longest: after_.longest
      }
    end
  end

  defp reader(store, t, n, stop, h, calls \\ 0) do
    if rem(calls, 256) == 0 and System.monotonic_time(:millisecond) > stop do
      calls
    else
      k = :rand.uniform(n)
      timed(h, fn -> lookup(store, t, k) end)
      reader(store, t, n, stop, h, calls + 1)
    end
  end

  defp writer(store, t, n, stop, h, next, calls \\ 0) do
    if rem(calls, 256) == 0 and System.monotonic_time(:millisecond) > stop do
      calls
    else
      k = :rand.uniform(n)
      timed(h, fn -> delete_key(store, t, k) end)
      timed(h, fn -> insert(store, t, record(next, 200)) end)
      writer(store, t, n, stop, h, next + 1, calls + 2)
    end
  end

  defp compact_until(t, stop) do
    receive do
      {:stop, from} -> send(from, :compactor_done)
    after
      0 ->
        if System.monotonic_time(:millisecond) < stop, do: {:ok, _} = Heft.compact(t)
        Process.sleep(10)
        compact_until(t, stop)
    end
  end

  # Runs `call`, counting its time (µs) in the histogram `h`.
  defp timed(h, call) do
    t0 = System.monotonic_time(:nanosecond)
    call.()
    ns = System.monotonic_time(:nanosecond) - t0
    us = div(ns, 1000)
    :atomics.add(h, min(us, @buckets - 1) + 1, 1)
    if us > :atomics.get(h, @buckets + 1), do: :atomics.put(h, @buckets + 1, us)
  end

  defp merged(hs) do
    for i <- 1..@buckets, do: Enum.reduce(hs, 0, &(&2 + :atomics.get(&1, i)))
  end

  # The bucket (µs) below which a share `q` of the calls fell.
  defp percentile(counts, calls, q) do
    want = Float.ceil(calls * q)

    Enum.reduce_while(Enum.with_index(counts), 0, fn {c, i}, acc ->
      if acc + c >= want, do: {:halt, i}, else: {:cont, acc + c}
    end)
  end

  defp new(:heft), do: Heft.new(:mixed, [:public])
  defp new(:ets), do: :ets.new(:mixed, [:public, read_concurrency: true])
  defp insert(:heft, t, r), do: Heft.insert(t, r)
  defp insert(:ets, t, r), do: :ets.insert(t, r)
  defp lookup(:heft, t, k), do: Heft.lookup(t, k)
  defp lookup(:ets, t, k), do: :ets.lookup(t, k)
  defp delete_key(:heft, t, k), do: Heft.delete(t, k)
  defp delete_key(:ets, t, k), do: :ets.delete(t, k)
  defp delete(:heft, t), do: Heft.delete(t)
  defp delete(:ets, t), do: :ets.delete(t)

  defp compaction(:heft, t) do
    c = Heft.info(t, :compaction)
    %{runs: c.runs, longest: c.longest_lock_hold_us}
  end

  defp compaction(:ets, _t), do: %{runs: 0, longest: nil}

  defp print(r) do
    IO.puts(
      "| #{r.run} | #{r.store} | #{r.role} | #{r.calls} | #{r.p50} | #{r.p99} | #{r.p999} | " <>
        "#{r.max} | #{r.compactions} | #{r.longest || ""} |"
    )
  end

  defp spread(vals) do
    s = Enum.sort(vals)
    med = Enum.at(s, div(length(s), 2))
    "#{med} (#{hd(s)}-#{List.last(s)})"
  end
end

Heft.Bench.Mixed.main(System.argv())
