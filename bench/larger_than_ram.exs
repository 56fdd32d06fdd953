# A file arena larger than the memory its VM may use: a child VM in a
# memory cgroup (v1) fills a table with incompressible records, then looks
# them up at random.
#
#     mix run bench/larger_than_ram.exs                      # 1,536 MiB in 512 MiB
#     mix run bench/larger_than_ram.exs --table-mib 768 --limit-mib 256 --seconds 20
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

  @switches [table_mib: :integer, limit_mib: :integer, seconds: :integer, child: :boolean]

  def main(argv) do
    {opts, _, _} = OptionParser.parse(argv, strict: @switches)
    table = Keyword.get(opts, :table_mib, 1536)
    seconds = Keyword.get(opts, :seconds, 20)

    if opts[:child],
      do: child(table, seconds),
      else: parent(table, Keyword.get(opts, :limit_mib, 512), seconds)
  end

  defp parent(table, limit, seconds) do
    case cgroup_base() do
      {:ok, base} ->
        cg = Path.join(base, "heft-bench-#{System.pid()}")
        File.mkdir_p!(cg)
        File.write!(Path.join(cg, "memory.limit_in_bytes"), Integer.to_string(limit <<< 20))

        IO.puts(
          "# a #{table} MiB file arena in a #{limit} MiB memory cgroup (#{:erlang.system_info(:otp_release)}; " <>
            "load average #{Sys.load_average()})\n"
        )

        script =
          "echo $$ > #{cg}/cgroup.procs && exec mix run bench/larger_than_ram.exs --child " <>
            "--table-mib #{table} --seconds #{seconds}"

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

  defp child(table_mib, seconds) do
    dir = System.get_env("HEFT_BENCH_DIR") || "/var/tmp"
    t = Heft.new(:larger_than_ram, arena: {:file, dir}, compression: :none)
    target = table_mib <<< 20
    read0 = Sys.read_bytes()

    {us, {n, bytes}} =
      :timer.tc(fn ->
        Stream.iterate(1, &(&1 + 1))
        |> Enum.reduce_while({0, 0}, fn k, {n, b} ->
          if b >= target do
            {:halt, {n, b}}
          else
            v = :crypto.strong_rand_bytes(1024 + :rand.uniform(3072))
            true = Heft.insert(t, {k, v})
            {:cont, {n + 1, b + byte_size(v)}}
          end
        end)
      end)

    read1 = Sys.read_bytes()

    IO.puts(
      "inserted #{n} records of 1-4 KiB, #{bytes >>> 20} MiB, in #{div(us, 1000)} ms: " <>
        "#{fmt(bytes / 1_048_576 / (us / 1.0e6))} MiB/s, " <>
        "#{fmt((read1 - read0) / bytes, 3)} bytes read from disk per byte inserted"
    )

    faults0 = Sys.major_faults()
    deadline = System.monotonic_time(:millisecond) + seconds * 1000
    times = lookups(t, n, deadline, [])
    read2 = Sys.read_bytes()
    faults = Sys.major_faults() - faults0
    count = length(times)
    sorted = Enum.sort(times)

    IO.puts(
      "random lookups for #{seconds} s: #{fmt(count / seconds)} a second, " <>
        "p50 #{Enum.at(sorted, div(count, 2))} µs, p99 #{Enum.at(sorted, div(count * 99, 100))} µs, " <>
        "#{fmt((read2 - read1) / count / 1024)} KiB read from disk and " <>
        "#{fmt(faults / count, 2)} major faults per lookup"
    )

    Heft.delete(t)
  end

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
