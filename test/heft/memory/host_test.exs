defmodule Heft.Memory.HostTest do
  use ExUnit.Case, async: true

  import Heft.Test.Fixtures

  @gib 1024 * 1024 * 1024

  defp host(machine), do: Heft.Memory.host(root: machine(machine))

  test "every fixture machine yields every key, figures as integers or nil" do
    for m <- machines() do
      h = host(m)
      assert is_integer(h.mem_total) and h.mem_total > 0, m
      assert is_integer(h.mem_available) and h.mem_available <= h.mem_total, m
      assert h.swap_used == h.swap_total - h.swap_free, m
      assert is_map(h.dirty_limits), m
    end
  end

  describe "this machine (captured): cgroup v1, no limit, no swap" do
    setup do: %{h: host("firecracker-v1")}

    test "meminfo in bytes", %{h: h} do
      assert h.mem_total == kib(24_684_084)
      assert h.dirty == kib(512)
      assert h.swap_total == 0 and h.swap_used == 0
    end

    test "the v1 memory cgroup, unlimited", %{h: h} do
      cg = h.cgroup
      assert cg.version == 1
      assert cg.path == "/process_api/9cf4e72fb437c3b0d81203dd0279298e"
      assert cg.dir == "/sys/fs/cgroup/memory" <> cg.path
      assert cg.limit == nil and h.cgroup_limit == nil
      assert cg.usage == 87_969_792 and h.cgroup_usage == cg.usage
      assert cg.working_set == 87_969_792 - 16_674_816
      assert cg.oom_kills == 0
    end

    test "the dirty budget from the ratios", %{h: h} do
      d = h.dirty_limits
      dirtyable = kib(24_078_724 + 249_208 + 92_024)
      assert d.dirtyable_bytes == dirtyable
      assert d.background_threshold == div(10 * dirtyable, 100)
      assert d.throttle_threshold == div(20 * dirtyable, 100)
      assert d.expire_ms == 30_000 and d.writeback_interval_ms == 5_000
    end

    test "I/O pressure", %{h: h} do
      assert h.io_pressure.full.avg60 == 0.18
    end
  end

  describe "docker-v2-limited: namespaced cgroup v2 with a 2 GiB limit" do
    setup do: %{h: host("docker-v2-limited")}

    test "the container's cgroup is / under its own mount", %{h: h} do
      cg = h.cgroup
      assert cg.version == 2 and cg.path == "/" and cg.dir == "/sys/fs/cgroup"
      assert cg.limit == 2 * @gib and cg.high == nil
      assert cg.usage == 1_992_916_992
      assert cg.working_set == 1_992_916_992 - 83_886_080
      assert cg.swap_limit == 2 * @gib and cg.swap_usage == 104_857_600
      assert cg.oom_kills == 2 and cg.peak == nil
      assert cg.io_pressure.some.avg60 == 0.12
    end

    test "swap in use on the host", %{h: h} do
      assert h.swap_used == kib(4_194_300 - 3_362_684)
    end

    test "the cgroup's writeback domain is smaller than the host's", %{h: h} do
      d = h.dirty_limits
      cg_dirtyable = 125_829_120 + (2 * @gib - 1_992_916_992)
      assert d.cgroup_dirtyable_bytes == cg_dirtyable
      assert d.background_threshold == div(10 * cg_dirtyable, 100)
      assert d.throttle_threshold == div(20 * cg_dirtyable, 100)
    end
  end

  describe "centos7-v1-limited: cgroup v1 mounted at /docker/<id>, 3.10 kernel" do
    setup do: %{h: host("centos7-v1-limited")}

    test "the path is taken relative to the mount's root", %{h: h} do
      cg = h.cgroup
      assert cg.version == 1
      assert cg.dir == "/sys/fs/cgroup/memory"
      assert cg.limit == 4 * @gib and cg.limit_dir == "/sys/fs/cgroup/memory"
      assert cg.usage == 1_288_490_188 and cg.peak == 3 * @gib
      assert cg.swap_limit == 0 and cg.swap_usage == 0
      # 3.10: no oom_kill line, no dirty/writeback in memory.stat.
      assert cg.oom_kills == nil and cg.dirty == nil
    end

    test "no PSI and no swap", %{h: h} do
      assert h.io_pressure == nil
      assert h.swap_total == 0
    end

    test "a dirty budget set in bytes", %{h: h} do
      d = h.dirty_limits
      assert d.dirty_ratio == 0 and d.dirty_bytes == 268_435_456
      assert d.background_threshold == 134_217_728
      assert d.throttle_threshold == 268_435_456
    end
  end

  describe "chroot-nocgroup: no cgroup filesystem, no PSI, no swap" do
    test "cgroup and pressure are nil, not guessed" do
      h = host("chroot-nocgroup")
      assert h.cgroup == nil and h.cgroup_limit == nil and h.cgroup_usage == nil
      assert h.io_pressure == nil
      assert h.swap_total == 0
      assert h.mem_total == kib(3_963_728)
    end
  end

  describe "systemd-v2-host: the limit sits on an ancestor slice" do
    test "the effective limit is the smallest memory.max up the tree" do
      cg = host("systemd-v2-host").cgroup
      assert cg.path == "/system.slice/heft.service"
      assert cg.dir == "/sys/fs/cgroup/system.slice/heft.service"
      assert cg.limit == 48 * @gib
      assert cg.limit_dir == "/sys/fs/cgroup/system.slice"
      assert cg.peak == 22 * @gib
      assert cg.dirty == 4 * @gib
    end
  end

  test "a missing root reads as unavailable everywhere" do
    h = Heft.Memory.host(root: "/nonexistent-heft-root")
    assert h.mem_total == nil and h.cgroup == nil and h.io_pressure == nil
    assert h.dirty_limits.background_threshold == nil
  end

  describe "live machine" do
    test "host/0 agrees with /proc and the cgroup it names" do
      h = Heft.Memory.host()
      assert h.mem_total > 0 and h.mem_available <= h.mem_total
      assert h.dirty_limits.background_threshold <= h.dirty_limits.throttle_threshold

      if cg = h.cgroup do
        assert cg.version in [1, 2]
        assert File.dir?(cg.dir)
        assert cg.usage > 0
      end
    end
  end
end
