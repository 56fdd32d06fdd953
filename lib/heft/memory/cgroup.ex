defmodule Heft.Memory.Cgroup do
  # The memory cgroup this OS process is charged to, and its limit and usage.
  #
  # Finding it: /proc/self/cgroup names a path per hierarchy ("0::/path" for
  # v2, "N:memory:/path" for the v1 memory controller); /proc/self/mountinfo
  # says where that hierarchy is mounted and which cgroup the mount shows as
  # its root (a container without a cgroup namespace mounts "/docker/<id>" at
  # /sys/fs/cgroup/memory, so the path is taken relative to that root).
  #
  # v2 is used when the node's v2 cgroup has the memory controller (its
  # directory has memory.current or memory.max; the true root cgroup has
  # neither, and a hybrid host such as systemd's "unified" mount may run v2
  # without memory). Otherwise the v1 memory controller, otherwise nil.
  #
  # Limits are inherited: a v2 cgroup's effective limit is the smallest
  # memory.max of it and its ancestors up to the mount, so all of them are
  # read. v1 reports that minimum itself as hierarchical_memory_limit in
  # memory.stat. "No limit" is "max" in v2 and, in v1, PAGE_COUNTER_MAX
  # pages (9223372036854771712 with 4 KiB pages); both become nil. Anything
  # at or above 2^62 is taken as that.
  @moduledoc false

  alias Heft.Memory.{Proc, Source}

  # 2^62: v1 limits at or above it are "unlimited" (PAGE_COUNTER_MAX * page
  # size is just under 2^63 for any page size).
  @v1_unlimited 4_611_686_018_427_387_904

  @spec read(Source.t()) :: map | nil
  def read(source) do
    with text when is_binary(text) <- Source.read!(source, "/proc/self/cgroup") do
      membership = Proc.cgroup_membership(text)
      mounts = Proc.cgroup_mounts(Source.read!(source, "/proc/self/mountinfo") || "")
      v2(source, membership, mounts) || v1(source, membership, mounts)
    end
  end

  defp v2(_source, %{v2: nil}, _mounts), do: nil

  defp v2(source, %{v2: path}, mounts) do
    with %{} = mount <- Enum.find(mounts, &(&1.version == 2)),
         {dir, chain} = dirs(mount, path),
         stat = Proc.flat_keyed(file(source, dir, "memory.stat") || ""),
         usage when is_integer(usage) <- int(source, dir, "memory.current") do
      {limit, limit_dir} = min_along(source, chain, "memory.max")
      {high, _} = min_along(source, chain, "memory.high")
      events = Proc.flat_keyed(file(source, dir, "memory.events") || "")
      inactive_file = stat["inactive_file"] || 0

      %{
        version: 2,
        path: path,
        dir: dir,
        limit: limit,
        limit_dir: limit_dir,
        high: high,
        usage: usage,
        working_set: max(usage - inactive_file, 0),
        peak: int(source, dir, "memory.peak"),
        swap_limit: swap_limit(int(source, dir, "memory.swap.max")),
        swap_usage: int(source, dir, "memory.swap.current"),
        anon: stat["anon"],
        file: stat["file"],
        shmem: stat["shmem"],
        dirty: stat["file_dirty"],
        writeback: stat["file_writeback"],
        oom_kills: events["oom_kill"],
        io_pressure: pressure(file(source, dir, "io.pressure"))
      }
    else
      _ -> nil
    end
  end

  defp v1(source, %{v1: %{"memory" => path}}, mounts) do
    with %{} = mount <- Enum.find(mounts, &(&1.version == 1 and "memory" in &1.controllers)),
         {dir, _chain} = dirs(mount, path),
         usage when is_integer(usage) <- int(source, dir, "memory.usage_in_bytes") do
      stat = Proc.flat_keyed(file(source, dir, "memory.stat") || "")
      own = unlimited_to_nil(int(source, dir, "memory.limit_in_bytes"))
      hier = unlimited_to_nil(stat["hierarchical_memory_limit"])
      limit = Enum.min([own, hier] |> Enum.reject(&is_nil/1), fn -> nil end)
      memsw_limit = unlimited_to_nil(int(source, dir, "memory.memsw.limit_in_bytes"))
      memsw_usage = int(source, dir, "memory.memsw.usage_in_bytes")
      # total_* include descendant cgroups, as usage_in_bytes does.
      s = fn k -> stat["total_" <> k] || stat[k] end

      %{
        version: 1,
        path: path,
        dir: dir,
        limit: limit,
        limit_dir: if(limit != nil and limit == own, do: dir, else: nil),
        high: nil,
        usage: usage,
        working_set: max(usage - (s.("inactive_file") || 0), 0),
        peak: int(source, dir, "memory.max_usage_in_bytes"),
        swap_limit: memsw_limit && limit && max(memsw_limit - limit, 0),
        swap_usage: memsw_usage && max(memsw_usage - usage, 0),
        anon: s.("rss"),
        file: s.("cache"),
        shmem: s.("shmem"),
        dirty: s.("dirty"),
        writeback: s.("writeback"),
        oom_kills: oom_kills(file(source, dir, "memory.oom_control")),
        io_pressure: nil
      }
    else
      _ -> nil
    end
  end

  defp v1(_source, _membership, _mounts), do: nil

  # The cgroup's directory and its ancestors up to the mount, nearest first.
  defp dirs(%{root: root, mount: mount}, path) do
    rel =
      cond do
        root == "/" -> path
        path == root -> "/"
        String.starts_with?(path, root <> "/") -> String.replace_prefix(path, root, "")
        # The path lies outside what this mount shows (a cgroup namespace
        # boundary); the mount's own directory is the nearest we can read.
        true -> "/"
      end

    parts = String.split(rel, "/", trim: true)
    chain = for n <- length(parts)..0//-1, do: Path.join([mount | Enum.take(parts, n)])
    {hd(chain), chain}
  end

  # Smallest integer value of `name` along the chain, and where it was set.
  defp min_along(source, chain, name) do
    chain
    |> Enum.map(&{int(source, &1, name), &1})
    |> Enum.filter(fn {v, _} -> is_integer(v) end)
    |> Enum.min_by(fn {v, _} -> v end, fn -> {nil, nil} end)
  end

  defp file(source, dir, name), do: Source.read!(source, Path.join(dir, name))

  defp int(source, dir, name) do
    case file(source, dir, name) do
      nil -> nil
      text -> Proc.value(text)
    end
  end

  defp swap_limit(:max), do: nil
  defp swap_limit(v), do: v

  defp unlimited_to_nil(v) when is_integer(v) and v < @v1_unlimited, do: v
  defp unlimited_to_nil(_), do: nil

  defp pressure(nil), do: nil
  defp pressure(text), do: Proc.pressure(text)

  # memory.oom_control: "oom_kill_disable 0\nunder_oom 0\noom_kill 0" (the
  # oom_kill line exists since 4.13).
  defp oom_kills(nil), do: nil
  defp oom_kills(text), do: Proc.flat_keyed(text)["oom_kill"]
end
