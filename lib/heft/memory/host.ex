defmodule Heft.Memory.Host do
  # Builds the map Heft.Memory.host/0 returns (its @doc lists every key).
  # Reads /proc/meminfo, /proc/sys/vm/dirty_*, /proc/pressure/io and the
  # node's memory cgroup through a Source. A file that cannot be read yields
  # nil for the figures it carries; nothing is estimated in its place.
  @moduledoc false

  alias Heft.Memory.{Cgroup, Proc, Source, Writeback}

  @spec read(Source.t()) :: map
  def read(source) do
    meminfo = Proc.meminfo(Source.read!(source, "/proc/meminfo") || "")
    cgroup = Cgroup.read(source)

    sysctls =
      for k <- Writeback.knobs(), into: %{} do
        text = Source.read!(source, "/proc/sys/vm/#{k}")
        {k, text && Proc.value(text)}
      end

    swap_total = meminfo["SwapTotal"]
    swap_free = meminfo["SwapFree"]

    %{
      mem_total: meminfo["MemTotal"],
      mem_free: meminfo["MemFree"],
      mem_available: meminfo["MemAvailable"],
      buffers: meminfo["Buffers"],
      cached: meminfo["Cached"],
      shmem: meminfo["Shmem"],
      active_file: meminfo["Active(file)"],
      inactive_file: meminfo["Inactive(file)"],
      swap_total: swap_total,
      swap_free: swap_free,
      swap_used: swap_total && swap_free && swap_total - swap_free,
      swap_cached: meminfo["SwapCached"],
      dirty: meminfo["Dirty"],
      writeback: meminfo["Writeback"],
      cgroup: cgroup,
      cgroup_limit: cgroup && cgroup.limit,
      cgroup_usage: cgroup && cgroup.usage,
      dirty_limits: Writeback.resolve(sysctls, meminfo, cgroup),
      io_pressure: pressure(Source.read!(source, "/proc/pressure/io"))
    }
  end

  # /proc/pressure/io is absent without CONFIG_PSI and unreadable
  # (EOPNOTSUPP) when booted with psi=0: both are nil.
  defp pressure(nil), do: nil

  defp pressure(text) do
    case Proc.pressure(text) do
      empty when empty == %{} -> nil
      psi -> psi
    end
  end
end
