defmodule Heft.Memory.Warnings do
  # Turns a snapshot (host, node, tables) into a list of
  # {severity, code, message}, most severe first. Pure: tests feed it
  # snapshots built from fixtures. The codes and when they fire are listed in
  # Heft.Memory.warnings/1's @doc; the thresholds live here.
  @moduledoc false

  alias Heft.Memory.{Units, Writeback}

  # Above this share of the host's RAM or the cgroup limit the OOM killer is
  # one allocation burst away (the seed node died at 15 of 16 GB, 94%).
  @oom_share 0.85
  # Share of wall time all non-idle tasks were stalled on I/O (PSI "full",
  # avg60) worth a warning; the seed query ran at 25%.
  @io_full_pct 10.0
  # File arenas holding more than this share of their cgroup's limit cannot
  # stay in its page cache beside the node: host-wide dirty settings are moot.
  @cgroup_file_share 0.5
  # ETS tables below this are too small for the x4 mistake to matter.
  @words_min_bytes 1024 * 1024

  @severity_order %{error: 0, warning: 1, info: 2}

  def check(%{host: host, node: node, tables: tables}, opts \\ []) do
    [
      oom_host(host, node),
      oom_cgroup(host[:cgroup], node),
      dirty(host, tables[:heft], opts),
      swap(host, node),
      io_pressure(host),
      words(tables[:ets], node),
      heft_unavailable(tables[:heft])
    ]
    |> List.flatten()
    |> Enum.sort_by(fn {sev, _, _} -> @severity_order[sev] end)
  end

  defp oom_host(%{mem_total: total, mem_available: avail}, node)
       when is_integer(total) and is_integer(avail) and total > 0 do
    oom(:oom_risk_host, "host memory", total - avail, total, "#{b(avail)} available", node)
  end

  defp oom_host(_, _), do: []

  defp oom_cgroup(%{limit: limit, working_set: ws} = cg, node)
       when is_integer(limit) and is_integer(ws) and limit > 0 do
    note = "not counting reclaimable file cache"
    oom(:oom_risk_cgroup, "cgroup #{cg.path}", ws, limit, note, node)
  end

  defp oom_cgroup(_, _), do: []

  defp oom(code, what, used, limit, note, node) do
    if used > @oom_share * limit do
      {:error, code,
       "#{what} at #{pct(used, limit)} of #{b(limit)} (#{b(used)} used, #{note})" <>
         "#{node_share(node)}: above #{pct(@oom_share)} the OOM killer is near"}
    else
      []
    end
  end

  defp node_share(%{rss: rss}) when is_integer(rss), do: "; this node holds #{b(rss)}"
  defp node_share(_), do: ""

  # File-backed arenas: every byte written into one is dirty page cache
  # until the kernel writes it back, so the working set is what the arena
  # holds (live bytes), or what smaps says is dirty if that is more.
  defp dirty(host, heft, opts) when is_list(heft) do
    files = Enum.filter(heft, &match?({:file, _}, &1[:arena]))

    ws =
      files
      |> Enum.map(&max(&1[:arena_live_bytes] || 0, &1[:arena_dirty_bytes] || 0))
      |> Enum.sum()

    where = files |> Enum.map(fn t -> elem(t[:arena], 1) end) |> Enum.uniq() |> Enum.join(", ")
    cg = host[:cgroup] || %{}

    cond do
      files == [] or ws == 0 or not is_integer(host[:mem_total]) ->
        []

      is_integer(cg[:limit]) and cg.limit > 0 and ws > cg.limit * @cgroup_file_share ->
        outgrown(ws, cg, where)

      true ->
        arena_dirty = files |> Enum.map(&(&1[:arena_dirty_bytes] || 0)) |> Enum.sum()
        others = max((host[:dirty] || 0) - arena_dirty, 0)
        rec = Writeback.recommend(host, ws, Keyword.put(opts, :arena_dirty, arena_dirty))
        limits = host[:dirty_limits] || %{}
        [budget(ws, others, limits, rec, where), expiry(ws, limits, rec, where)]
    end
  end

  defp dirty(_host, _heft, _opts), do: []

  # The arenas hold more than the cgroup can keep as page cache beside the
  # node: its reclaim writes their pages back and reads them in again as
  # they are used, whatever the host-wide vm.dirty_* settings say, so
  # advising those (or the flusher's expiry) would be beside the point.
  defp outgrown(ws, cg, where) do
    {:warning, :dirty_budget,
     "file arenas (#{where}) hold #{b(ws)}, more than half of cgroup #{cg.path}'s " <>
       "limit #{b(cg.limit)}: the cgroup's reclaim writes their pages back and reads " <>
       "them again as they are used, whatever the vm.dirty_* settings (host-wide). " <>
       "Raise the cgroup's memory limit, or keep the arenas well under it, or make " <>
       "them tiered (arena: {:file, dir, memory: bytes}): memory first, and a file " <>
       "kept clean"}
  end

  defp budget(ws, others, limits, rec, where) do
    bg = limits[:background_threshold]
    throttle = limits[:throttle_threshold]
    total = ws + others

    {sev, what} =
      cond do
        is_integer(throttle) and total > throttle ->
          {:error, "over the throttle limit #{b(throttle)}: writers are made to wait"}

        is_integer(bg) and total > bg ->
          {:warning, "over the background limit #{b(bg)}: the flusher writes them out"}

        true ->
          {nil, nil}
      end

    if sev do
      {sev, :dirty_budget,
       "file arenas (#{where}) can hold #{b(ws)} dirty, with #{b(others)} dirty " <>
         "elsewhere: #{what}. " <> hold(rec)}
    else
      []
    end
  end

  defp expiry(ws, %{expire_ms: expire, writeback_interval_ms: every}, rec, where)
       when is_integer(expire) and is_integer(every) and expire < rec.dirty_expire_centisecs * 10 do
    {:warning, :dirty_expiry,
     "file arenas (#{where}, #{b(ws)}): pages dirty longer than " <>
       "#{seconds(expire)} are written back (flusher every #{seconds(every)}) " <>
       "however much RAM is free. For a disposable arena: " <>
       "vm.dirty_expire_centisecs = #{rec.dirty_expire_centisecs}, " <>
       "vm.dirty_writeback_centisecs = #{rec.dirty_writeback_centisecs}. Or make " <>
       "the arenas tiered (arena: {:file, dir, memory: bytes}): nothing is written " <>
       "while the records fit the budget"}
  end

  defp expiry(_, _, _, _), do: []

  defp hold(%{fits: true} = rec) do
    "To hold them: vm.dirty_background_bytes = #{rec.dirty_background_bytes} " <>
      "(#{b(rec.dirty_background_bytes)}), vm.dirty_bytes = #{rec.dirty_bytes} " <>
      "(#{b(rec.dirty_bytes)})"
  end

  defp hold(rec) do
    "No safe budget holds them (at most vm.dirty_background_bytes = " <>
      "#{rec.dirty_background_bytes}, vm.dirty_bytes = #{rec.dirty_bytes}, a quarter " <>
      "and half of RAM): use a memory arena, or fewer/smaller file arenas"
  end

  defp swap(host, node) do
    node_swap = (is_map(node) && node[:swap]) || 0
    used = host[:swap_used] || 0

    cond do
      node_swap > 0 ->
        {:warning, :swap_in_use,
         "this node has #{b(node_swap)} in swap (host: #{b(used)} of " <>
           "#{b(host[:swap_total] || 0)}): touching it waits for the disk"}

      used > 0 ->
        {:warning, :swap_in_use,
         "host swap in use: #{b(used)} of #{b(host[:swap_total])} (none of it this node's)"}

      true ->
        []
    end
  end

  defp io_pressure(%{io_pressure: %{full: %{avg60: full}}}) when full >= @io_full_pct do
    {:warning, :io_pressure,
     "I/O pressure: all tasks stalled on I/O #{full}% of the last minute " <>
       "(/proc/pressure/io full avg60)"}
  end

  defp io_pressure(_), do: []

  # The seed's mistake: ets:info/2 memory is in words, multiplied by 4 on a
  # 64-bit VM. Said once, with the largest table's own figures.
  defp words([%{bytes: bytes} = t | _], %{word_size: ws}) when bytes >= @words_min_bytes do
    {:info, :words_not_bytes,
     "ets:info(#{inspect(t.name)}, :memory) says #{t.words} words: that is " <>
       "#{b(bytes)} (x#{ws} bytes), not #{b(t.words * 4)} (x4). " <>
       "mnesia:info/0 counts words too; this report shows bytes"}
  end

  defp words(_, _), do: []

  defp heft_unavailable(nil) do
    {:info, :heft_unavailable,
     "Heft is not loaded on this node: its tables and native memory are unavailable (nil)"}
  end

  defp heft_unavailable(_), do: []

  defp b(n), do: Units.format(n)
  defp pct(share), do: "#{round(share * 100)}%"
  defp pct(part, whole), do: "#{Float.round(part * 100 / whole, 1)}%"

  defp seconds(ms) when rem(ms, 1000) == 0, do: "#{div(ms, 1000)} s"
  defp seconds(ms), do: "#{ms / 1000} s"
end
