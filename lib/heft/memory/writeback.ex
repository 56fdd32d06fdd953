defmodule Heft.Memory.Writeback do
  # The kernel's dirty-page budget, resolved to bytes, and the vm.dirty_*
  # values that would let a file-backed arena stay dirty in RAM.
  #
  # How the kernel turns the sysctls into limits (mm/page-writeback.c,
  # domain_dirty_limits):
  #   dirtyable  = free pages + active file + inactive file pages
  #                (global_dirtyable_memory; minus totalreserve_pages, which
  #                /proc/meminfo does not show, so ours is a slight
  #                overestimate of a few MiB)
  #   throttle   = vm.dirty_bytes            if non-zero
  #                vm.dirty_ratio % of dirtyable otherwise
  #   background = vm.dirty_background_bytes if non-zero
  #                vm.dirty_background_ratio % of dirtyable otherwise
  #   if background >= throttle: background = throttle / 2
  # Above `background` the flusher threads start writing; above `throttle`
  # the writing task itself is made to wait. Independently of both, every
  # dirty_writeback_centisecs the flusher writes pages that have been dirty
  # longer than dirty_expire_centisecs, however much RAM is free.
  #
  # Under cgroup v2 with a memory limit the kernel also applies the same
  # rules to the cgroup (its "writeback domain", mdtc): dirtyable is the
  # cgroup's file pages plus its headroom below the limit, and *_bytes knobs
  # are scaled by that share of the global dirtyable memory. The smaller of
  # the two limits is the one that bites. (cgroup v1 has no writeback domain.)
  @moduledoc false

  @gib 1024 * 1024 * 1024

  @knobs ~w(dirty_background_bytes dirty_background_ratio dirty_bytes dirty_ratio
            dirty_expire_centisecs dirty_writeback_centisecs)a

  def knobs, do: @knobs

  # sysctls: %{dirty_ratio: 20, ...} (any may be nil when unreadable);
  # meminfo: parsed /proc/meminfo (bytes); cgroup: Heft.Memory.Cgroup map or nil.
  def resolve(sysctls, meminfo, cgroup) do
    dirtyable = dirtyable(meminfo)
    global = limits(sysctls, dirtyable, 1.0)
    cg_dirtyable = cgroup_dirtyable(cgroup, dirtyable)

    cg =
      if cg_dirtyable && dirtyable && dirtyable > 0,
        do: limits(sysctls, cg_dirtyable, cg_dirtyable / dirtyable),
        else: {nil, nil}

    {background, throttle} = min_pair(global, cg)

    Map.merge(sysctls, %{
      dirtyable_bytes: dirtyable,
      cgroup_dirtyable_bytes: cg_dirtyable,
      background_threshold: background,
      throttle_threshold: throttle,
      expire_ms: sysctls[:dirty_expire_centisecs] && sysctls.dirty_expire_centisecs * 10,
      writeback_interval_ms:
        sysctls[:dirty_writeback_centisecs] && sysctls.dirty_writeback_centisecs * 10
    })
  end

  defp dirtyable(m) do
    case {m["MemFree"], m["Active(file)"], m["Inactive(file)"]} do
      {f, a, i} when is_integer(f) and is_integer(a) and is_integer(i) -> f + a + i
      _ -> nil
    end
  end

  defp cgroup_dirtyable(%{version: 2, limit: limit, usage: usage, file: file}, global)
       when is_integer(limit) and is_integer(usage) and is_integer(file) and is_integer(global) do
    file + min(max(limit - usage, 0), global)
  end

  defp cgroup_dirtyable(_, _), do: nil

  defp limits(_s, nil, _share), do: {nil, nil}

  defp limits(s, dirtyable, share) do
    throttle = limit(s[:dirty_bytes], s[:dirty_ratio], dirtyable, share)
    background = limit(s[:dirty_background_bytes], s[:dirty_background_ratio], dirtyable, share)

    if is_integer(background) and is_integer(throttle) and background >= throttle,
      do: {div(throttle, 2), throttle},
      else: {background, throttle}
  end

  defp limit(bytes, _ratio, _dirtyable, share) when is_integer(bytes) and bytes > 0,
    do: round(bytes * share)

  defp limit(_bytes, ratio, dirtyable, _share) when is_integer(ratio),
    do: div(ratio * dirtyable, 100)

  defp limit(_, _, _, _), do: nil

  defp min_pair({b1, t1}, {b2, t2}), do: {min_nil(b1, b2), min_nil(t1, t2)}
  defp min_nil(nil, b), do: b
  defp min_nil(a, nil), do: a
  defp min_nil(a, b), do: min(a, b)

  # The values that would hold `working_set` bytes of file-backed arena dirty
  # in RAM, reasoned as in the seed article (shared/seeds/000: "size
  # vm.dirty_bytes and vm.dirty_background_bytes against the largest
  # transient working set you expect, not against a fixed fraction of RAM";
  # "keep dirty_background_bytes at or below dirty_bytes, and both well below
  # total RAM"; prefer the *_bytes knobs, which do not move when RAM changes):
  #
  #   background = working set + the dirty data others already keep
  #                (meminfo Dirty), then the next whole GiB above that, so
  #                no background flush starts while the arena is dirty and
  #                the others write a little more;
  #   dirty      = 2 x background (the article's 16 GiB / 32 GiB shape), so
  #                the writer is not throttled at the background line;
  #   ceiling    = half of MemTotal for dirty, a quarter for background (the
  #                article's own choice on 64 GB: 32 GiB and 16 GiB), leaving
  #                the rest to page cache and the node. When the working set
  #                needs more than the ceiling, nothing holds it: :fits false.
  #
  # The two timers do not depend on the machine's figures but on how long
  # the arena lives: expire is set to outlive it (opts[:arena_lifetime],
  # seconds, default one day -> 8_640_000 centisecs) and the flusher wakes
  # every 10 minutes (60_000), so it rarely runs. Raising them is only safe
  # because a Heft arena is disposable; it weakens the durability of other
  # software on the machine that relies on the periodic flusher.
  def recommend(host, working_set, opts \\ []) do
    lifetime = Keyword.get(opts, :arena_lifetime, 86_400)
    others = max((host[:dirty] || 0) - Keyword.get(opts, :arena_dirty, 0), 0)
    total = host.mem_total
    # Whole GiB read best; a small machine gets 64 MiB steps instead.
    unit = if total >= 8 * @gib, do: @gib, else: 64 * 1024 * 1024
    need = round_up(working_set + others, unit)
    bg_cap = round_down(div(total, 4), unit)
    dirty_cap = round_down(div(total, 2), unit)
    background = min(need, bg_cap)

    %{
      dirty_background_bytes: background,
      # Strictly above background, or the kernel halves background.
      dirty_bytes: max(min(2 * need, dirty_cap), background + unit),
      dirty_expire_centisecs: lifetime * 100,
      dirty_writeback_centisecs: 60_000,
      fits: need <= bg_cap
    }
  end

  # The next multiple of unit strictly above b.
  defp round_up(b, unit), do: (div(b, unit) + 1) * unit
  defp round_down(b, unit), do: div(b, unit) * unit
end
