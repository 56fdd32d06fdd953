# A table bounded in bytes under a sustained insert stream, next to the
# same table unbounded, in one VM.
#
#     mix run bench/budget.exs                  # max_bytes 64 MiB, 10x, 5 runs
#     mix run bench/budget.exs --mib 16 --factor 4 --runs 1
#
# Records `{i, %{id: i, name: "user-i", blob: <0-199 bytes>}}` (blobs of
# one repeated byte, as in bench/churn.exs), inserted one at a time by one
# process. The stream is as many records as make an unbounded table's
# `info(:memory)` `factor` times the budget. Each run sends it into an
# unbounded table and into one with `max_bytes: budget`, in alternating
# order, deleting each table after it. While the bounded table is
# written, every 100,000 inserts it samples the budget's `used_bytes`,
# the table's resident memory (its arena's and index's, from smaps) and
# the VM's (VmRSS, against what it was before the table was made, a
# second after the previous table was deleted), and, from the first
# sample at which the table has evicted, `info(:memory)` (also its
# largest over the second half of the stream alone, once the first
# compactions have settled). The unbounded table is sampled alike (for
# the same cost in its time). Prints per run, then medians with the
# spread (min-max) over the runs.
Code.require_file("harness.exs", __DIR__)

defmodule Heft.Bench.Budget do
  @moduledoc false
  alias Heft.Bench.Sys

  @switches [mib: :integer, factor: :integer, runs: :integer]
  @sample 100_000

  def main(argv) do
    {opts, _, _} = OptionParser.parse(argv, strict: @switches)
    budget = Keyword.get(opts, :mib, 64) * 1024 * 1024
    factor = Keyword.get(opts, :factor, 10)
    runs = Keyword.get(opts, :runs, 5)

    IO.puts(
      "# budget: max_bytes #{mib(budget)}, a stream of #{factor}x that, #{runs} runs " <>
        "(#{Sys.context()})\n"
    )

    IO.puts(
      "| run | records | unbounded rec/s | bounded rec/s | bounded / unbounded | " <>
        ":memory / budget (min-max) | :memory / budget, 2nd half (max) | used / budget (max) | resident / budget (max) | VmRSS growth / budget | evicted |"
    )

    IO.puts("|---|---|---|---|---|---|---|---|---|---|---|")

    n = stream_length(budget * factor)

    rows =
      for run <- 1..runs do
        {free_rate, bounded} =
          if rem(run, 2) == 1 do
            free_rate = unbounded(n)
            {free_rate, bounded(budget, n)}
          else
            bounded = bounded(budget, n)
            {unbounded(n), bounded}
          end

        row = Map.merge(bounded, %{run: run, records: n, free_rate: free_rate})
        print(row)
        row
      end

    IO.puts("")
    IO.puts("Medians (min-max) over #{runs} runs:\n")
    IO.puts("| measure | median | spread |")
    IO.puts("|---|---|---|")

    for {label, f} <- [
          {"bounded / unbounded throughput", &(&1.rate / &1.free_rate)},
          {"max :memory / budget", & &1.mem_max},
          {"max :memory / budget, 2nd half of the stream", & &1.mem_late},
          {"min :memory / budget (full)", & &1.mem_min},
          {"max used_bytes / budget", & &1.used_max},
          {"max table resident / budget", & &1.resident},
          {"max VmRSS growth / budget", & &1.rss}
        ] do
      vals = Enum.map(rows, f)
      IO.puts("| #{label} | #{r(median(vals))} | #{r(Enum.min(vals))}-#{r(Enum.max(vals))} |")
    end
  end

  defp record(i),
    do: {i, %{id: i, name: "user-#{i}", blob: :binary.copy(<<rem(i, 251)>>, rem(i * 7919, 200))}}

  # The number of records at which an unbounded table's :memory reaches
  # `bytes`: the stream.
  defp stream_length(bytes) do
    t = Heft.new(:unbounded, [])
    n = fill(t, 1, bytes)
    Heft.delete(t)
    n
  end

  defp fill(t, i, bytes) do
    Heft.insert(t, record(i))

    if rem(i, @sample) == 0 and Heft.info(t, :memory) >= bytes,
      do: i,
      else: fill(t, i + 1, bytes)
  end

  # The insert rate of the stream into an unbounded table.
  defp unbounded(n) do
    t = Heft.new(:unbounded, [])
    t0 = System.monotonic_time()

    Enum.reduce(1..n, %{mem: [], used: [], resident: 0, rss: 0}, fn i, acc ->
      Heft.insert(t, record(i))
      if rem(i, @sample) == 0, do: sample(t, 0, acc), else: acc
    end)

    rate = n / seconds(t0)
    Heft.delete(t)
    settle()
    rate
  end

  defp bounded(budget, n) do
    rss0 = Sys.rss()
    t = Heft.new(:bounded, max_bytes: budget)
    t0 = System.monotonic_time()
    acc = %{mem: [], used: [], resident: 0, rss: 0}

    acc =
      Enum.reduce(1..n, acc, fn i, acc ->
        Heft.insert(t, record(i))
        if rem(i, @sample) == 0, do: sample(t, rss0, acc), else: acc
      end)

    rate = n / seconds(t0)
    b = Heft.info(t, :budget)
    Heft.delete(t)
    settle()

    %{
      rate: rate,
      mem_min: Enum.min(acc.mem) / budget,
      mem_max: Enum.max(acc.mem) / budget,
      # Samples come newest first: the second half of the stream.
      mem_late: Enum.max(Enum.take(acc.mem, div(length(acc.mem), 2))) / budget,
      used_max: Enum.max(acc.used) / budget,
      rss: acc.rss / budget,
      resident: acc.resident / budget,
      evicted: b.evicted_records
    }
  end

  defp sample(t, rss0, acc) do
    b = Heft.info(t, :budget) || %{used_bytes: 0, evicted_records: 0}
    resident = Heft.info(t, :arena_resident_bytes) + Heft.info(t, :index_resident_bytes)

    acc = %{
      acc
      | used: [b.used_bytes | acc.used],
        resident: max(acc.resident, resident),
        rss: max(acc.rss, Sys.rss() - rss0)
    }

    # :memory from the first sample at which the table is full.
    if b.evicted_records > 0, do: %{acc | mem: [Heft.info(t, :memory) | acc.mem]}, else: acc
  end

  # A deleted table's arena is unmapped by a thread: a second for it.
  defp settle do
    :erlang.garbage_collect()
    Process.sleep(1000)
  end

  defp print(row) do
    IO.puts(
      "| #{row.run} | #{row.records} | #{round(row.free_rate)} | #{round(row.rate)} | " <>
        "#{r(row.rate / row.free_rate)} | #{r(row.mem_min)}-#{r(row.mem_max)} | #{r(row.mem_late)} | " <>
        "#{r(row.used_max)} | #{r(row.resident)} | #{r(row.rss)} | #{row.evicted} |"
    )
  end

  defp seconds(t0),
    do: System.convert_time_unit(System.monotonic_time() - t0, :native, :microsecond) / 1.0e6

  defp median(vals) do
    s = Enum.sort(vals)
    n = length(s)

    if rem(n, 2) == 1,
      do: Enum.at(s, div(n, 2)),
      else: (Enum.at(s, div(n, 2) - 1) + Enum.at(s, div(n, 2))) / 2
  end

  defp r(x), do: :erlang.float_to_binary(x / 1, decimals: 3)
  defp mib(b), do: "#{div(b, 1024 * 1024)} MiB"
end

Heft.Bench.Budget.main(System.argv())
