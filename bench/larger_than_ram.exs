# A file arena larger than the memory its VM may use: a child VM in a
# memory cgroup (v1) fills a table with incompressible records, then looks
# them up at random.
#
#     mix run bench/larger_than_ram.exs                      # 1,536 MiB in 512 MiB
#     mix run bench/larger_than_ram.exs --table-mib 768 --limit-mib 256 --seconds 20
#     mix run bench/larger_than_ram.exs --memory-mib 256     # tiered: 256 MiB in memory
#     mix run bench/larger_than_ram.exs --fits --table-mib 256 --limit-mib 2048
#     mix run bench/larger_than_ram.exs --persist --memory-mib 192
#
# `--memory-mib M` makes the arena tiered (`arena: {:file, dir, memory: M
# MiB}`) instead of all file. `--fits` measures a tiered table that fits
# its budget (the table's size and a half): the bytes it writes to disk
# while held idle for `--idle-seconds` (default 75, past the kernel's
# 30 s dirty expiry), then random lookups against the same records in a
# memory arena, alternating 2-second rounds, five of each. `--persist`
# fills a persistent table (`sync: :none`) whose working copy is tiered,
# kills its VM with SIGKILL, and opens the table again in a second VM in
# the same cgroup: how long the open took, whether every acknowledged
# record is there, and random lookups.
#
# Needs root and the cgroup v1 memory controller (the cgroup is made below
# this process's own and removed afterwards); says so and skips otherwise.
# Prints the insert rate, the bytes read from disk per byte inserted, and
# for the lookups their rate, p50/p99 latency, the bytes read from disk per
# lookup and the major faults per lookup (/proc/self/io, /proc/self/stat
# of the child). The arena goes in $HEFT_BENCH_DIR (default /var/tmp).
Code.require_file("harness.exs", __DIR__)

defmodule Heft.Bench.LargerThanRam do
  @moduledoc false
  import Bitwise
  alias Heft.Bench.Sys

  @switches [
    table_mib: :integer,
    limit_mib: :integer,
    seconds: :integer,
    memory_mib: :integer,
    fits: :boolean,
    persist: :boolean,
    reopen: :boolean,
    idle_seconds: :integer,
    child: :boolean
  ]

  def main(argv) do
    {opts, _, _} = OptionParser.parse(argv, strict: @switches)
    table = Keyword.get(opts, :table_mib, 1536)
    seconds = Keyword.get(opts, :seconds, 20)

    cond do
      opts[:child] && opts[:fits] -> fits(table, Keyword.get(opts, :idle_seconds, 75))
      opts[:child] && opts[:reopen] -> reopen(opts[:memory_mib] || 192, seconds)
      opts[:child] && opts[:persist] -> persist(table, opts[:memory_mib] || 192)
      opts[:child] -> child(table, seconds, opts[:memory_mib], Keyword.get(opts, :limit_mib, 512))
      true -> parent(table, Keyword.get(opts, :limit_mib, 512), argv)
    end
  end

  defp parent(table, limit, argv) do
    case cgroup_base() do
      {:ok, base} ->
        cg = Path.join(base, "heft-bench-#{System.pid()}")
        File.mkdir_p!(cg)
        File.write!(Path.join(cg, "memory.limit_in_bytes"), Integer.to_string(limit <<< 20))

        IO.puts(
          "# a #{table} MiB table in a #{limit} MiB memory cgroup (#{Enum.join(argv, " ")}; " <>
            "#{Sys.context()})\n"
        )

        run = "mix run bench/larger_than_ram.exs --child #{Enum.join(argv, " ")}"

        script =
          if "--persist" in argv,
            do: "echo $$ > #{cg}/cgroup.procs && #{run}; exec #{run} --reopen",
            else: "echo $$ > #{cg}/cgroup.procs && exec #{run}"

        try do
          {_, status} =
            System.cmd("sh", ["-c", script], into: IO.stream(), stderr_to_stdout: true)

          if status != 0, do: IO.puts("the child VM exited with status #{status}")
        after
          File.rmdir(cg)
        end

      {:skip, why} ->
        IO.puts("skipped: #{why}")
    end
  end

  defp cgroup_base do
    own =
      "/proc/self/cgroup"
      |> File.read!()
      |> String.split("\n", trim: true)
      |> Enum.find_value(fn line ->
        case String.split(line, ":", parts: 3) do
          [_, "memory", path] -> path
          _ -> nil
        end
      end)

    base = own && Path.join("/sys/fs/cgroup/memory", own)

    cond do
      File.stat!("/proc/self").uid != 0 ->
        {:skip, "needs root to make a memory cgroup"}

      base == nil or not File.dir?(base) ->
        {:skip, "no cgroup v1 memory controller"}

      true ->
        {:ok, base}
    end
  end

  defp dir, do: System.get_env("HEFT_BENCH_DIR") || "/var/tmp"

  defp arena(nil), do: {:file, dir()}
  defp arena(mib), do: {:file, dir(), memory: mib <<< 20}

  # Inserts incompressible 1-4 KiB records until `target` bytes:
  # `{records, bytes, µs}`. Once `past` bytes are in, it notes the time
  # and the disk bytes read so far (process dictionary `:past`).
  defp fill(t, target, past \\ nil) do
    {us, {n, bytes}} =
      :timer.tc(fn ->
        Stream.iterate(1, &(&1 + 1))
        |> Enum.reduce_while({0, 0}, fn k, {n, b} ->
          if b >= target do
            {:halt, {n, b}}
          else
            if past && b >= past && Process.get(:past) == nil,
              do: Process.put(:past, {System.monotonic_time(:microsecond), b, Sys.read_bytes()})

            v = :crypto.strong_rand_bytes(1024 + :rand.uniform(3072))
            true = Heft.insert(t, {k, v})
            {:cont, {n + 1, b + byte_size(v)}}
          end
        end)
      end)

    {n, bytes, us}
  end

  defp child(table_mib, seconds, memory_mib, limit_mib) do
    t = Heft.new(:larger_than_ram, arena: arena(memory_mib), compression: :none)
    IO.puts("arena: #{inspect(Heft.info(t, :arena))}")
    {read0, write0} = {Sys.read_bytes(), Sys.write_bytes()}
    {n, bytes, us} = fill(t, table_mib <<< 20, limit_mib <<< 20)
    {read1, t1} = {Sys.read_bytes(), System.monotonic_time(:microsecond)}

    IO.puts(
      "inserted #{n} records of 1-4 KiB, #{bytes >>> 20} MiB, in #{div(us, 1000)} ms: " <>
        "#{fmt(bytes / 1_048_576 / (us / 1.0e6))} MiB/s, " <>
        "#{fmt((read1 - read0) / bytes, 3)} bytes read from disk per byte inserted"
    )

    case Process.get(:past) do
      {t0, b0, r0} ->
        IO.puts(
          "past the #{limit_mib} MiB limit (the last #{(bytes - b0) >>> 20} MiB): " <>
            "#{fmt((bytes - b0) / 1_048_576 / ((t1 - t0) / 1.0e6))} MiB/s, " <>
            "#{fmt((read1 - r0) / (bytes - b0), 3)} bytes read from disk per byte inserted"
        )

      nil ->
        :ok
    end

    if memory_mib do
      # The mover's last steps.
      settle(t, memory_mib <<< 20)
      tier = Heft.info(t, :tier)

      IO.puts(
        "memory #{tier.memory_live_bytes >>> 20} MiB live (budget #{memory_mib} MiB), file " <>
          "#{tier.file_live_bytes >>> 20} MiB live; moved #{tier.moved_records} records"
      )
    end

    IO.puts(
      "#{fmt((Sys.write_bytes() - write0) / bytes, 3)} bytes written to disk per byte stored " <>
        "(pages dirtied, /proc/self/io write_bytes)"
    )

    random_lookups(t, n, seconds)
    Heft.delete(t)
  end

  # Looks up keys 1..n at random for `seconds` and prints the rate, p50
  # and p99, and the disk bytes read and major faults per lookup.
  defp random_lookups(t, n, seconds) do
    {read0, faults0} = {Sys.read_bytes(), Sys.major_faults()}
    deadline = System.monotonic_time(:millisecond) + seconds * 1000
    times = lookups(t, n, deadline, [])
    {read, faults} = {Sys.read_bytes() - read0, Sys.major_faults() - faults0}
    count = length(times)
    sorted = Enum.sort(times)

    IO.puts(
      "random lookups for #{seconds} s: #{fmt(count / seconds)} a second, " <>
        "p50 #{Enum.at(sorted, div(count, 2))} µs, p99 #{Enum.at(sorted, div(count * 99, 100))} µs, " <>
        "#{fmt(read / count / 1024)} KiB read from disk and " <>
        "#{fmt(faults / count, 2)} major faults per lookup"
    )
  end

  defp settle(t, budget, until \\ System.monotonic_time(:millisecond) + 60_000) do
    if Heft.info(t, :tier).memory_live_bytes > budget and
         System.monotonic_time(:millisecond) < until do
      Process.sleep(50)
      settle(t, budget, until)
    end
  end

  # A tiered table within its budget: what it writes to disk while idle,
  # and its lookups against a memory arena's.
  defp fits(table_mib, idle_seconds) do
    t = Heft.new(:fits, arena: arena((table_mib * 3) >>> 1), compression: :none)
    m = Heft.new(:memory, compression: :none)
    {n, bytes, us} = fill(t, table_mib <<< 20)
    Heft.insert(m, Heft.tab2list(t))
    tier = Heft.info(t, :tier)

    IO.puts(
      "tiered, memory #{(table_mib * 3) >>> 1} MiB: inserted #{n} records, #{bytes >>> 20} MiB, " <>
        "in #{div(us, 1000)} ms; memory #{tier.memory_live_bytes >>> 20} MiB, " <>
        "file #{tier.file_live_bytes} bytes"
    )

    write0 = Sys.write_bytes()
    Process.sleep(idle_seconds * 1000)

    IO.puts("held idle #{idle_seconds} s: #{Sys.write_bytes() - write0} bytes written to disk")

    rounds =
      for _ <- 1..5 do
        {rate(t, n), rate(m, n)}
      end

    {ts, ms} = Enum.unzip(rounds)
    {tm, mm} = {median(ts), median(ms)}

    IO.puts(
      "random lookups, 5 alternating rounds of 2 s: tiered #{fmt(tm)}/s " <>
        "(#{fmt(Enum.min(ts))}-#{fmt(Enum.max(ts))}), memory arena #{fmt(mm)}/s " <>
        "(#{fmt(Enum.min(ms))}-#{fmt(Enum.max(ms))}): a tiered lookup takes " <>
        "#{fmt(mm / tm, 2)}x a memory arena's"
    )
  end

  defp table_dir, do: Path.join(dir(), "heft-bench-persist")

  # Fills a persistent table with a tiered working copy, notes how many
  # inserts were acknowledged, and dies by SIGKILL.
  defp persist(table_mib, memory_mib) do
    File.rm_rf!(table_dir())

    t =
      Heft.new(:persisted,
        persist: table_dir(),
        arena: arena(memory_mib),
        compression: :none,
        sync: :none
      )

    {n, bytes, us} = fill(t, table_mib <<< 20)
    tier = Heft.info(t, :tier)

    IO.puts(
      "persistent, memory #{memory_mib} MiB: inserted #{n} records, #{bytes >>> 20} MiB, in " <>
        "#{div(us, 1000)} ms (#{fmt(bytes / 1_048_576 / (us / 1.0e6))} MiB/s); memory " <>
        "#{tier.memory_live_bytes >>> 20} MiB, file #{tier.file_live_bytes >>> 20} MiB; " <>
        "acknowledged #{n}; SIGKILL"
    )

    File.write!(Path.join(dir(), "heft-bench-persist.count"), Integer.to_string(n))
    System.cmd("kill", ["-KILL", System.pid()])
  end

  # Opens what `persist/2` left, checks it, looks records up at random.
  defp reopen(memory_mib, seconds) do
    n = String.to_integer(File.read!(Path.join(dir(), "heft-bench-persist.count")))
    {us, {:ok, t}} = :timer.tc(fn -> Heft.open(table_dir(), arena: arena(memory_mib)) end)
    size = Heft.info(t, :size)
    missing = Enum.count(1..n, &(Heft.member(t, &1) == false))
    tier = Heft.info(t, :tier)

    IO.puts(
      "reopened in #{div(us, 1000)} ms: #{size} records, #{missing} of #{n} acknowledged missing; " <>
        "memory #{tier.memory_live_bytes >>> 20} MiB, file #{tier.file_live_bytes >>> 20} MiB"
    )

    random_lookups(t, n, seconds)
    Heft.delete(t)
    File.rm_rf!(table_dir())
  end

  defp rate(t, n) do
    deadline = System.monotonic_time(:millisecond) + 2000
    length(lookups(t, n, deadline, [])) / 2
  end

  defp median(xs), do: Enum.at(Enum.sort(xs), div(length(xs), 2))

  defp lookups(t, n, deadline, acc) do
    if System.monotonic_time(:millisecond) > deadline do
      acc
    else
      k = :rand.uniform(n)
      {us, [{^k, _}]} = :timer.tc(fn -> Heft.lookup(t, k) end)
      lookups(t, n, deadline, [us | acc])
    end
  end

  defp fmt(x, decimals \\ 1), do: :erlang.float_to_binary(x / 1, decimals: decimals)
end

Heft.Bench.LargerThanRam.main(System.argv())
