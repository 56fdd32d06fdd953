defmodule Heft.Bench.Sys do
  # What the bench reads from the OS: this process's resident memory and
  # block-layer writes, the memory the host has available, the allocated
  # size of a directory, and a one-line description of the machine.
  @moduledoc false

  # VmRSS of this OS process, in bytes.
  def rss, do: proc_kb("/proc/self/status", "VmRSS")

  # MemAvailable of the host, in bytes: what can be used before swapping or
  # the OOM killer.
  def mem_available, do: proc_kb("/proc/meminfo", "MemAvailable")

  # The 1-minute load average: other work on the host perturbs the timings.
  def load_average do
    "/proc/loadavg" |> File.read!() |> String.split() |> hd() |> String.to_float()
  end

  def mem_total, do: proc_kb("/proc/meminfo", "MemTotal")

  # Bytes this process caused to be sent to the storage layer so far
  # (`write_bytes` of /proc/self/io; counted when a page is dirtied, which
  # includes stores through a shared mmap).
  def write_bytes, do: io_counter("write_bytes")

  # Bytes this process caused to be read from the storage layer so far
  # (`read_bytes` of /proc/self/io; faults on a file mapping included).
  def read_bytes, do: io_counter("read_bytes")

  defp io_counter(name) do
    "/proc/self/io"
    |> File.read!()
    |> then(&Regex.run(~r/^#{name}:\s+(\d+)/m, &1, capture: :all_but_first))
    |> then(fn [n] -> String.to_integer(n) end)
  end

  # Major page faults of this process so far (majflt, field 12 of
  # /proc/self/stat; the BEAM's command name has no spaces).
  def major_faults do
    "/proc/self/stat" |> File.read!() |> String.split(" ") |> Enum.at(11) |> String.to_integer()
  end

  # Bytes allocated on disk below `path` (blocks, not apparent size: a
  # sparse file counts for what it holds).
  def disk_bytes(path) do
    {out, 0} = System.cmd("du", ["-s", "-B1", path])
    out |> String.split() |> hd() |> String.to_integer()
  end

  # "Intel(R) Xeon(R) Processor, 2 cores, 24 GiB RAM, Debian 12.11, OTP 25 (erts-13.1.5), Elixir 1.14.0"
  def machine do
    Enum.join(
      [
        cpu(),
        "#{:erlang.system_info(:logical_processors_available)} cores",
        "#{round(mem_total() / 1024 ** 3)} GiB RAM",
        os(),
        "OTP #{:erlang.system_info(:otp_release)} (erts-#{:erlang.system_info(:version)})",
        "Elixir #{System.version()}"
      ],
      ", "
    )
  end

  # What a benchmark's first line says of where it ran:
  # "OTP 25, Intel Xeon Processor, 2 cores, ..., load average 0.52".
  def context do
    "OTP #{:erlang.system_info(:otp_release)}, #{machine_short()}, load average #{load_average()}"
  end

  # Short form for plot titles: "Intel Xeon Processor, 2 cores, 24 GiB, Debian 12.11, OTP 25".
  def machine_short do
    Enum.join(
      [
        cpu() |> String.replace(~r/\((R|TM)\)/, "") |> String.replace(~r/\s+/, " "),
        "#{:erlang.system_info(:logical_processors_available)} cores",
        "#{round(mem_total() / 1024 ** 3)} GiB",
        os(),
        "OTP #{:erlang.system_info(:otp_release)}"
      ],
      ", "
    )
  end

  defp cpu do
    with {:ok, text} <- File.read("/proc/cpuinfo"),
         [name] <- Regex.run(~r/^model name\s*:\s*(.+)$/m, text, capture: :all_but_first) do
      String.trim(name)
    else
      _ -> "unknown CPU"
    end
  end

  defp os do
    case File.read("/etc/debian_version") do
      {:ok, v} ->
        "Debian #{String.trim(v)}"

      _ ->
        case File.read("/etc/os-release") do
          {:ok, text} ->
            case Regex.run(~r/^PRETTY_NAME="?([^"\n]+)/m, text, capture: :all_but_first) do
              [name] -> name
              _ -> "Linux"
            end

          _ ->
            "Linux"
        end
    end
  end

  defp proc_kb(file, field) do
    [kb] = Regex.run(~r/^#{field}:\s+(\d+) kB/m, File.read!(file), capture: :all_but_first)
    String.to_integer(kb) * 1024
  end
end
