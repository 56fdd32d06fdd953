defmodule Heft.Memory.WarningsTest do
  use ExUnit.Case, async: true

  import Heft.Test.Fixtures
  alias Heft.Memory.{Warnings, Writeback}

  @gib 1024 * 1024 * 1024

  defp host(m), do: Heft.Memory.host(root: machine(m))

  defp vm(opts) do
    %{word_size: 8, rss: Keyword.get(opts, :rss, @gib), swap: Keyword.get(opts, :swap, 0)}
  end

  defp snapshot(m, opts \\ []) do
    %{
      host: host(m),
      node: vm(opts),
      tables: %{ets: Keyword.get(opts, :ets, []), heft: Keyword.get(opts, :heft, [])}
    }
  end

  # A Heft table with a file arena, as Heft.info/1 describes one.
  defp file_table(live, dirty) do
    %{
      name: :scratch,
      arena: {:file, "/srv/heft"},
      memory: live + 1024,
      index_bytes: 1024,
      arena_mapped_bytes: live,
      arena_live_bytes: live,
      arena_resident_bytes: live,
      arena_dirty_bytes: dirty
    }
  end

  defp codes(ws), do: Enum.map(ws, fn {_, code, _} -> code end)
  defp find(ws, code), do: Enum.find(ws, fn {_, c, _} -> c == code end)

  test "a quiet machine: no warnings" do
    assert Warnings.check(snapshot("firecracker-v1")) == []
  end

  test "the cgroup's working set above 85% of its limit is an OOM risk" do
    {:error, :oom_risk_cgroup, msg} =
      find(Warnings.check(snapshot("docker-v2-limited")), :oom_risk_cgroup)

    assert msg =~ "cgroup / at 88.9% of 2.0 GiB (1.8 GiB used"
  end

  test "the host above 85% used is an OOM risk" do
    h = host("firecracker-v1")
    h = %{h | mem_available: div(h.mem_total, 10)}
    ws = Warnings.check(%{snapshot("firecracker-v1") | host: h})
    assert {:error, :oom_risk_host, msg} = find(ws, :oom_risk_host)
    assert msg =~ "host memory at 90.0% of 23.5 GiB"
  end

  test "swap: the host's, and this node's own" do
    assert {:warning, :swap_in_use, msg} =
             find(Warnings.check(snapshot("docker-v2-limited")), :swap_in_use)

    assert msg =~ "host swap in use: 812 MiB"

    {:warning, :swap_in_use, msg} =
      find(Warnings.check(snapshot("docker-v2-limited", swap: 96 * 1024 * 1024)), :swap_in_use)

    assert msg =~ "this node has 96.0 MiB in swap"
    refute :swap_in_use in codes(Warnings.check(snapshot("chroot-nocgroup")))
  end

  test "I/O pressure as in the seed (25% full)" do
    assert {:warning, :io_pressure, msg} =
             find(Warnings.check(snapshot("systemd-v2-host")), :io_pressure)

    assert msg =~ "25.31%"
    refute :io_pressure in codes(Warnings.check(snapshot("centos7-v1-limited")))
  end

  test "ETS figures quoted in words: the largest table in words and bytes" do
    ets = [%{name: :mytab, words: 1_901_665_342, bytes: 1_901_665_342 * 8}]

    {:info, :words_not_bytes, msg} =
      find(Warnings.check(snapshot("firecracker-v1", ets: ets)), :words_not_bytes)

    assert msg =~ "1901665342 words"
    assert msg =~ "14.2 GiB (x8 bytes), not 7.1 GiB (x4)"
  end

  test "Heft not loaded is said, not hidden" do
    ws = Warnings.check(put_in(snapshot("firecracker-v1").tables.heft, nil))
    assert [{:info, :heft_unavailable, _}] = ws
  end

  describe "file-backed arenas and the dirty budget" do
    test "a memory arena never triggers them" do
      t = %{file_table(8 * @gib, 8 * @gib) | arena: :memory}
      ws = Warnings.check(snapshot("firecracker-v1", heft: [t]))
      refute :dirty_budget in codes(ws)
      refute :dirty_expiry in codes(ws)
    end

    test "nor does a tiered arena, which keeps its file clean" do
      t = %{file_table(8 * @gib, 0) | arena: {:file, "/srv/x", memory: @gib}}
      ws = Warnings.check(snapshot("docker-v2-limited", heft: [t]))
      refute :dirty_budget in codes(ws)
      refute :dirty_expiry in codes(ws)
    end

    test "a small file arena: within budget, but still expires after 30 s" do
      ws = Warnings.check(snapshot("firecracker-v1", heft: [file_table(100 * 1024 * 1024, 0)]))
      refute :dirty_budget in codes(ws)
      {:warning, :dirty_expiry, msg} = find(ws, :dirty_expiry)
      assert msg =~ "dirty longer than 30 s"
      assert msg =~ "flusher every 5 s"
      assert msg =~ "vm.dirty_expire_centisecs = 8640000"
      assert msg =~ "Or make the arenas tiered"
    end

    test "above the background threshold: a warning with the values that hold it" do
      # This machine: 23.5 GiB RAM, background 10% of ~23 GiB dirtyable.
      ws = Warnings.check(snapshot("firecracker-v1", heft: [file_table(3 * @gib, 3 * @gib)]))
      {:warning, :dirty_budget, msg} = find(ws, :dirty_budget)
      assert msg =~ "over the background limit 2.3 GiB"
      assert msg =~ "vm.dirty_background_bytes = #{4 * @gib}"
      assert msg =~ "vm.dirty_bytes = #{8 * @gib}"
    end

    test "above the throttle threshold, with the seed's 4.75 GiB dirty elsewhere: an error" do
      ws = Warnings.check(snapshot("systemd-v2-host", heft: [file_table(5 * @gib, 2 * @gib)]))
      {:error, :dirty_budget, msg} = find(ws, :dirty_budget)
      # The cgroup's domain: 20% of its file pages plus headroom, 6.8 GiB.
      assert msg =~ "over the throttle limit 6.8 GiB"
      # 5 GiB arena + (4.75 - 2) GiB dirty elsewhere = 7.75 GiB -> 8 GiB;
      # dirty twice that.
      assert msg =~ "vm.dirty_background_bytes = #{8 * @gib}"
      assert msg =~ "vm.dirty_bytes = #{16 * @gib}"
    end

    test "arenas that outgrow the cgroup's limit: the cgroup's reclaim, not host-wide settings" do
      # docker-v2-limited: a 2 GiB cgroup on a larger host.
      ws = Warnings.check(snapshot("docker-v2-limited", heft: [file_table(3 * @gib, 0)]))
      {:warning, :dirty_budget, msg} = find(ws, :dirty_budget)
      assert msg =~ "hold 3.0 GiB, more than half of cgroup /'s limit 2.0 GiB"
      assert msg =~ "Raise the cgroup's memory limit"
      assert msg =~ "make them tiered"
      refute msg =~ "vm.dirty_bytes ="
      refute :dirty_expiry in codes(ws)
      # Well inside the limit, the host-wide advice stands.
      ws = Warnings.check(snapshot("docker-v2-limited", heft: [file_table(200 * 1024 * 1024, 0)]))
      refute (find(ws, :dirty_budget) || {nil, nil, ""}) |> elem(2) =~ "cgroup"
    end

    test "an arena no safe budget can hold" do
      ws = Warnings.check(snapshot("chroot-nocgroup", heft: [file_table(2 * @gib, 0)]))
      {:error, :dirty_budget, msg} = find(ws, :dirty_budget)
      assert msg =~ "No safe budget holds them"
    end

    test "sorted most severe first" do
      ws = Warnings.check(snapshot("systemd-v2-host", heft: [file_table(5 * @gib, 2 * @gib)]))
      sevs = Enum.map(ws, &elem(&1, 0))
      assert sevs == Enum.sort_by(sevs, &%{error: 0, warning: 1, info: 2}[&1])
      assert hd(sevs) == :error
    end
  end

  describe "Writeback.recommend/3 follows the seed's rules on the host's own figures" do
    test "on this machine (captured), for arenas of 1 to 12 GiB" do
      h = host("firecracker-v1")

      for ws <- [1, 2, 3, 4, 6, 12] do
        r = Writeback.recommend(h, ws * @gib)
        # background holds the working set and what else is dirty ...
        if r.fits, do: assert(r.dirty_background_bytes >= ws * @gib + h.dirty)
        # ... throttle above background, both well below RAM.
        assert r.dirty_bytes > r.dirty_background_bytes
        assert r.dirty_bytes <= div(h.mem_total, 2)
        assert r.dirty_background_bytes <= div(h.mem_total, 4)
        assert rem(r.dirty_bytes, @gib) == 0
      end

      # 23.5 GiB of RAM: a quarter is 5.9 GiB, so 5 whole GiB at most.
      assert Writeback.recommend(h, 4 * @gib - h.dirty - 1).fits
      refute Writeback.recommend(h, 5 * @gib).fits
    end

    test "a small machine gets 64 MiB steps" do
      r = Writeback.recommend(host("chroot-nocgroup"), 300 * 1024 * 1024)
      assert r.fits
      assert r.dirty_background_bytes == 320 * 1024 * 1024
      assert r.dirty_bytes == 640 * 1024 * 1024
      assert Writeback.recommend(host("chroot-nocgroup"), 900 * 1024 * 1024).fits
      refute Writeback.recommend(host("chroot-nocgroup"), 1024 * 1024 * 1024).fits
    end
  end

  test "background at or above throttle is halved, as the kernel does" do
    sysctls = %{
      dirty_background_bytes: 512 * 1024 * 1024,
      dirty_background_ratio: 0,
      dirty_bytes: 256 * 1024 * 1024,
      dirty_ratio: 0,
      dirty_expire_centisecs: 3000,
      dirty_writeback_centisecs: 500
    }

    meminfo = %{"MemFree" => @gib, "Active(file)" => 0, "Inactive(file)" => 0}
    d = Writeback.resolve(sysctls, meminfo, nil)
    assert d.background_threshold == 128 * 1024 * 1024
    assert d.throttle_threshold == 256 * 1024 * 1024
  end
end
