defmodule Heft.Memory.Proc do
  # Parsers for the kernel's text files. Pure functions from file contents to
  # maps, so the same code serves the live machine, a remote node (whose files
  # arrive over :erpc) and fixtures. Nothing here reads a file.
  #
  # Units: the kernel writes "kB" in /proc/meminfo and smaps and means KiB
  # (1024 bytes; see fs/proc/meminfo.c, show_val_kb: pages << (PAGE_SHIFT - 10)).
  # Every "kB" figure is converted to bytes here; figures without a unit
  # (HugePages_Total, THPeligible) are counts and are kept as they are.
  @moduledoc false

  @kib 1024

  # /proc/meminfo: "MemTotal:       24684084 kB" -> %{"MemTotal" => 25276502016}.
  @spec meminfo(binary) :: %{String.t() => non_neg_integer}
  def meminfo(text), do: fields(text)

  # /proc/<pid>/smaps_rollup: one header line ("...-... ---p ... [rollup]"),
  # then the same "Key: N kB" fields as one smaps mapping, summed.
  @spec smaps_rollup(binary) :: %{String.t() => non_neg_integer}
  def smaps_rollup(text) do
    text
    |> String.split("\n", trim: true)
    |> Enum.reject(&mapping_header?/1)
    |> Enum.join("\n")
    |> fields()
  end

  # /proc/<pid>/smaps: a header line per mapping
  #   "7f3a94bbd000-7f3a98bbd000 rw-s 00000000 00:01 1056   /memfd:heft:users (deleted)"
  # (address range, perms, offset, device, inode, optional pathname), followed
  # by its "Key: N kB" lines, "THPeligible: 0" and "VmFlags: rd wr ...".
  # Returns the mappings in file order, each with :path (nil for anonymous),
  # :perms, :inode and the fields in bytes under :fields.
  @spec smaps(binary) :: [map]
  def smaps(text) do
    text
    |> String.split("\n", trim: true)
    |> Enum.chunk_while(nil, &chunk_mapping/2, &finish_mapping/1)
  end

  defp chunk_mapping(line, acc) do
    cond do
      mapping_header?(line) and acc == nil -> {:cont, {header(line), []}}
      mapping_header?(line) -> {:cont, mapping(acc), {header(line), []}}
      acc == nil -> {:cont, nil}
      true -> {:cont, put_elem(acc, 1, [line | elem(acc, 1)])}
    end
  end

  defp finish_mapping(nil), do: {:cont, nil}
  defp finish_mapping(acc), do: {:cont, mapping(acc), nil}

  defp mapping({header, lines}) do
    Map.put(header, :fields, lines |> Enum.reverse() |> Enum.join("\n") |> fields())
  end

  defp mapping_header?(line), do: Regex.match?(~r/^[0-9a-f]+-[0-9a-f]+ /, line)

  defp header(line) do
    # The pathname is the rest of the line after five fields and may itself
    # contain spaces ("/memfd:heft:users (deleted)").
    [range, perms, offset, dev, inode | rest] = String.split(line, " ", parts: 6, trim: true)
    [from, to] = range |> String.split("-") |> Enum.map(&String.to_integer(&1, 16))

    path =
      case rest do
        [] -> nil
        [p] -> if String.trim(p) == "", do: nil, else: String.trim(p)
      end

    %{
      start: from,
      size: to - from,
      perms: perms,
      offset: String.to_integer(offset, 16),
      dev: dev,
      inode: String.to_integer(inode),
      path: path
    }
  end

  # "some avg10=0.00 avg60=0.15 avg300=0.23 total=2600403" (and a "full"
  # line since 5.2 for io). avg* are percentages of wall time in which some
  # (or all non-idle) tasks were stalled on I/O; total is in microseconds.
  @spec pressure(binary) :: %{optional(:some | :full) => map}
  def pressure(text) do
    for line <- String.split(text, "\n", trim: true),
        [kind | pairs] = String.split(line, " ", trim: true),
        kind in ["some", "full"],
        into: %{} do
      values =
        for pair <- pairs, [k, v] = String.split(pair, "=", parts: 2), into: %{} do
          case k do
            "total" -> {:total_us, String.to_integer(v)}
            avg -> {String.to_atom(avg), String.to_float(v)}
          end
        end

      {String.to_atom(kind), values}
    end
  end

  # /proc/<pid>/cgroup: "hierarchy-ID:controller-list:cgroup-path" per line.
  # cgroup v2 is the line "0::/path"; a v1 controller line names its
  # controllers ("4:memory:/process_api/9cf4...", "3:cpu,cpuacct:/").
  @spec cgroup_membership(binary) :: %{v2: String.t() | nil, v1: %{String.t() => String.t()}}
  def cgroup_membership(text) do
    Enum.reduce(String.split(text, "\n", trim: true), %{v2: nil, v1: %{}}, fn line, acc ->
      case String.split(line, ":", parts: 3) do
        ["0", "", path] ->
          %{acc | v2: path}

        [_id, controllers, path] ->
          v1 = for c <- String.split(controllers, ","), into: acc.v1, do: {c, path}
          %{acc | v1: v1}

        _ ->
          acc
      end
    end)
  end

  # /proc/<pid>/mountinfo, cgroup mounts only:
  #   "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory"
  # fields: id, parent, major:minor, root (the cgroup directory this mount
  # shows, "/docker/<id>" for a container without a cgroup namespace), mount
  # point, options, optional fields, "-", fstype, source, super options.
  # A v1 mount's controllers are in its super options. Octal escapes ("\040"
  # for space) in paths are decoded.
  @spec cgroup_mounts(binary) :: [
          %{version: 1 | 2, root: String.t(), mount: String.t(), controllers: [String.t()]}
        ]
  def cgroup_mounts(text) do
    for line <- String.split(text, "\n", trim: true),
        {pre, [fstype, _source, super | _]} <- [split_mountinfo(line)],
        fstype in ["cgroup", "cgroup2"] do
      [_id, _parent, _dev, root, mount | _] = pre

      %{
        version: if(fstype == "cgroup2", do: 2, else: 1),
        root: unescape(root),
        mount: unescape(mount),
        controllers: if(fstype == "cgroup", do: String.split(super, ","), else: [])
      }
    end
  end

  defp split_mountinfo(line) do
    fields = String.split(line, " ", trim: true)

    case Enum.split_while(fields, &(&1 != "-")) do
      {pre, ["-" | post]} when length(pre) >= 6 -> {pre, post}
      _ -> {[], []}
    end
  end

  defp unescape(path) do
    Regex.replace(~r/\\([0-7]{3})/, path, fn _, oct -> <<String.to_integer(oct, 8)>> end)
  end

  # A cgroup or sysctl file holding one value: an integer, or "max" (cgroup
  # v2's "no limit"), which is returned as :max.
  @spec value(binary) :: integer | :max | nil
  def value(text) do
    case String.trim(text) do
      "max" -> :max
      s -> parse_int(s)
    end
  end

  # "key value" lines: cgroup memory.stat (v1 and v2, values in bytes except
  # the event counters) and memory.events. Values are kept as integers.
  @spec flat_keyed(binary) :: %{String.t() => integer}
  def flat_keyed(text) do
    for line <- String.split(text, "\n", trim: true),
        [k, v] <- [String.split(line, " ", trim: true)],
        n = parse_int(v),
        n != nil,
        into: %{},
        do: {k, n}
  end

  # /proc/<pid>/status has the same "VmRSS:\t   47756 kB" lines (tab
  # separated); used where smaps_rollup (Linux 4.14+) is missing.
  @spec status(binary) :: %{String.t() => non_neg_integer}
  def status(text), do: fields(text)

  # "Key:   N kB" / "Key: N" lines, as in meminfo and smaps. "kB" values are
  # converted to bytes; lines with other shapes (VmFlags) are skipped.
  defp fields(text) do
    for line <- String.split(text, "\n", trim: true),
        [key, rest] <- [String.split(line, ":", parts: 2)],
        {k, v} <- [field(key, String.split(rest))],
        into: %{},
        do: {k, v}
  end

  defp field(key, [n, "kB"]), do: with_int(key, n, &(&1 * @kib))
  defp field(key, [n]), do: with_int(key, n, & &1)
  defp field(_key, _), do: nil

  defp with_int(key, n, f) do
    case parse_int(n) do
      nil -> nil
      i -> {key, f.(i)}
    end
  end

  defp parse_int(s) do
    case Integer.parse(s) do
      {i, ""} -> i
      _ -> nil
    end
  end
end
