# Memory after churn: tables that delete and overwrite, next to ETS with
# the same records in the same VM, and a dictionary re-compression.
#
#     mix run bench/churn.exs                 # 1,000,000 records, 3 runs
#     mix run bench/churn.exs --records 200000 --runs 1
#     mix run bench/churn.exs --blob random   # incompressible blobs
#
# For each table type: load `{i, %{id: i, name: "user-i", blob: <0-199
# bytes>}}` (by default a blob repeats one byte: compressible, as ids and
# names around it are; `--blob random`: random bytes), delete 90% at random, then overwrite the rest three
# times with other sizes (a bag deletes a key before it writes it again).
# After each phase it waits until the table's automatic compactions are
# idle (at most 10 s) and prints Heft's `info(:memory)`, what the table
# needs (live arena + index + dictionaries), its ratio to that and to
# ETS's bytes, how long the compactions took to settle after the last
# write, and how far the table's resident memory (arena and index, from
# smaps) came down in the phase against what its compactions gave back. Then 50,000 JSON-like binaries of about 700 bytes with
# `{:zstd, dictionary: :auto}`, after the background re-compression.
# Medians over the runs, with the spread (min-max) where it varies.
Code.require_file("harness.exs", __DIR__)

defmodule Heft.Bench.Churn do
  @moduledoc false
  alias Heft.Bench.Sys

  @switches [records: :integer, runs: :integer, blob: :string]

  def main(argv) do
    {opts, _, _} = OptionParser.parse(argv, strict: @switches)
    n = Keyword.get(opts, :records, 1_000_000)
    runs = Keyword.get(opts, :runs, 3)
    blob = if opts[:blob] == "random", do: :random, else: :repeated
    Process.put(:blob, blob)

    IO.puts("# churn: #{n} records, #{blob} blobs, #{runs} runs (#{Sys.context()})\n")

    IO.puts(
      "| table | phase | Heft `info(:memory)` | needed (live + index + dicts) | Heft / needed | ETS | Heft / ETS | settled after | resident down / given back |"
    )

    IO.puts("|---|---|---|---|---|---|---|---|---|")

    latencies =
      for type <- [:set, :ordered_set, :bag] do
        samples = for _ <- 1..runs, do: churn(type, n)

        for phase <- [:loaded, :deleted, :overwritten] do
          rows = Enum.map(samples, &Map.fetch!(&1, phase))
          row(type, phase, rows)
        end

        {type, samples}
      end

    samples = for _ <- 1..runs, do: recompressed(div(n, 20))
    row(:"zstd :auto", :recompressed, samples)

    IO.puts("""

    While 90% of the records are deleted (the compactor running meanwhile):
    a process's random lookups and the deleting process's `delete/2` calls,
    µs (p99 / p99.9 / longest, of the calls of all runs)

    | table | lookups | p99 / p99.9 / max | deletes | p99 / p99.9 / max | compactor's longest lock hold |
    |---|---:|---|---:|---|---:|\
    """)

    for {type, samples} <- latencies do
      {reads, writes} = samples |> Enum.map(& &1.deleted.latency) |> Enum.unzip()
      {rp99, rp999, rmax, rn} = worst(reads)
      {wp99, wp999, wmax, wn} = worst(writes)

      hold = samples |> Enum.map(& &1.deleted.hold) |> Enum.max()

      IO.puts(
        "| #{type} | #{rn} | #{rp99} / #{rp999} / #{rmax} | #{wn} | #{wp99} / #{wp999} / #{wmax} | #{hold} µs |"
      )
    end

    IO.puts("\nload average after: #{Sys.load_average()}")
  end

  defp record(i, salt) do
    len = rem(i * 31 + salt * 7, 200)

    blob =
      case Process.get(:blob) do
        :random -> :crypto.strong_rand_bytes(len)
        _ -> :binary.copy(<<rem(i * 7 + salt, 251)>>, len)
      end

    {i, %{id: i, name: "user-#{i}", blob: blob}}
  end

  defp churn(type, n) do
    t = Heft.new(:churn, [type, :public])
    e = :ets.new(:churn, [type, :public])

    for chunk <- Enum.chunk_every(1..n, 1000) do
      objects = Enum.map(chunk, &record(&1, 0))
      Heft.insert(t, objects)
      :ets.insert(e, objects)
    end

    loaded = measure(t, e, Heft.info(t))
    start = Heft.info(t)
    :rand.seed(:exsss, {1, 2, 3})
    reader = spawn_link(fn -> read(t, n, []) end)

    writes =
      for i <- 1..n, :rand.uniform(10) > 1 do
        t0 = System.monotonic_time()
        Heft.delete(t, i)
        took = System.monotonic_time() - t0
        :ets.delete(e, i)
        took
      end

    send(reader, {:stop, self()})
    reads = receive do: ({:read, reads} -> reads)
    deleted = measure(t, e, start)
    hold = Heft.info(t, :compaction).longest_lock_hold_us
    deleted = Map.merge(deleted, %{latency: {tail(reads), tail(writes)}, hold: hold})

    start = Heft.info(t)

    for round <- 1..3 do
      keys = :ets.select(e, [{{:"$1", :_}, [], [:"$1"]}])

      for chunk <- Enum.chunk_every(keys, 1000) do
        objects = Enum.map(chunk, &record(&1, round))

        if type == :bag do
          Enum.each(chunk, &Heft.delete(t, &1))
          Enum.each(chunk, &:ets.delete(e, &1))
        end

        Heft.insert(t, objects)
        :ets.insert(e, objects)
      end
    end

    overwritten = measure(t, e, start)
    Heft.delete(t)
    :ets.delete(e)
    %{loaded: loaded, deleted: deleted, overwritten: overwritten}
  end

  # Random lookups, each timed, until told to stop.
  defp read(t, n, took) do
    receive do
      {:stop, to} -> send(to, {:read, took})
    after
      0 ->
        k = :rand.uniform(n)
        t0 = System.monotonic_time()
        Heft.lookup(t, k)
        read(t, n, [System.monotonic_time() - t0 | took])
    end
  end

  # p99, p99.9 and the longest of `times` (native units), in µs.
  defp tail(times) do
    sorted = times |> Enum.sort() |> List.to_tuple()
    at = fn q -> elem(sorted, min(tuple_size(sorted) - 1, trunc(q * tuple_size(sorted)))) end
    us = &System.convert_time_unit(&1, :native, :microsecond)

    {us.(at.(0.99)), us.(at.(0.999)), us.(elem(sorted, tuple_size(sorted) - 1)),
     tuple_size(sorted)}
  end

  # 700-byte JSON-like documents: the same fields, other values.
  defp recompressed(n) do
    t = Heft.new(:recompress, [:public, compression: {:zstd, dictionary: :auto}])

    for chunk <- Enum.chunk_every(1..n, 500) do
      Heft.insert(t, Enum.map(chunk, &{&1, json(&1)}))
    end

    start = Heft.info(t)

    wait_recompressed(t, System.monotonic_time(:millisecond) + 60_000)
    measure(t, nil, start)
  end

  defp json(i) do
    fields =
      for f <- 1..14,
          do:
            ~s("field_#{f}": "#{Base.encode16(:crypto.strong_rand_bytes(8))}-#{rem(i * f, 977)}")

    "{" <> Enum.join(fields, ", ") <> ~s(, "id": #{i}, "kind": "document", "ok": true})
  end

  defp wait_recompressed(t, until) do
    case Heft.info(t, :recompression).state do
      s when s in [:done, :failed] ->
        :ok

      _ ->
        if System.monotonic_time(:millisecond) < until,
          do: Process.sleep(50) && wait_recompressed(t, until),
          else: :ok
    end
  end

  # Waits (at most 10 s) until the table's compactions are idle; its
  # figures then, the time that took, and how far its resident memory
  # (arena and index, smaps) came down since `start` against what its
  # compactions gave back meanwhile.
  defp measure(t, e, start) do
    started = System.monotonic_time(:millisecond)
    settle(t, started + 10_000)
    settled = System.monotonic_time(:millisecond) - started
    info = Heft.info(t)
    given = info[:compaction].returned_bytes - start[:compaction].returned_bytes
    needed = info[:arena_live_bytes] + info[:index_bytes] + info[:dictionary_bytes]

    %{
      memory: info[:memory],
      needed: needed,
      ets: if(e, do: :ets.info(e, :memory) * :erlang.system_info(:wordsize)),
      settled_ms: settled,
      resident_down: resident(start) - resident(info),
      given: given
    }
  end

  # The table's memory as the kernel sees it (smaps): arena and index.
  defp resident(info), do: info[:arena_resident_bytes] + info[:index_resident_bytes]

  defp settle(t, until) do
    # A write's run may still be queued: give it a moment to start.
    Process.sleep(200)

    if Heft.info(t, :compaction).state == :running and
         System.monotonic_time(:millisecond) < until,
       do: settle(t, until),
       else: :ok
  end

  defp row(type, phase, rows) do
    med = fn key -> rows |> Enum.map(&Map.fetch!(&1, key)) |> median() end
    spread = fn key -> rows |> Enum.map(&Map.fetch!(&1, key)) |> Enum.min_max() end
    {memory, needed} = {med.(:memory), med.(:needed)}
    ets = if rows |> hd() |> Map.fetch!(:ets), do: med.(:ets)
    {lo, hi} = spread.(:settled_ms)
    given = med.(:given)

    rss =
      if given > 1_048_576,
        do: "#{mb(med.(:resident_down))} / #{mb(given)}",
        else: "-"

    IO.puts(
      "| #{type} | #{phase} | #{mb(memory)} | #{mb(needed)} | #{ratio(memory, needed)} | " <>
        "#{if ets, do: mb(ets), else: "-"} | #{if ets, do: ratio(memory, ets), else: "-"} | " <>
        "#{med.(:settled_ms)} ms (#{lo}-#{hi}) | #{rss} |"
    )
  end

  # The runs' tails: the median run's p99 and p99.9, the longest call of
  # all, and the calls counted.
  defp worst(tails) do
    {p99, p999, max, n} =
      Enum.reduce(tails, {[], [], 0, 0}, fn {a, b, c, d}, {as, bs, m, k} ->
        {[a | as], [b | bs], max(m, c), k + d}
      end)

    {median(p99), median(p999), max, n}
  end

  defp median(xs) do
    sorted = Enum.sort(xs)
    Enum.at(sorted, div(length(sorted), 2))
  end

  defp mb(bytes), do: :erlang.float_to_binary(bytes / 1_000_000, decimals: 1) <> " MB"
  defp ratio(a, b), do: :erlang.float_to_binary(a / b, decimals: 2)
end

Heft.Bench.Churn.main(System.argv())
