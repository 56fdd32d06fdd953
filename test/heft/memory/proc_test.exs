defmodule Heft.Memory.ProcTest do
  use ExUnit.Case, async: true

  alias Heft.Memory.Proc
  import Heft.Test.Fixtures

  describe "meminfo/1" do
    test "converts kB to bytes (the kernel's kB is KiB)" do
      m = Proc.meminfo(read!("proc/firecracker-v1/proc/meminfo"))
      assert m["MemTotal"] == kib(24_684_084)
      assert m["MemAvailable"] == kib(24_272_696)
      assert m["Hugepagesize"] == 2 * 1024 * 1024
    end

    test "keeps unit-less figures as counts" do
      m = Proc.meminfo(read!("proc/docker-v2-limited/proc/meminfo"))
      assert m["HugePages_Total"] == 0
      assert m["SwapTotal"] - m["SwapFree"] == kib(831_616)
    end

    test "reads a 3.10 kernel's meminfo (no Percpu, KReclaimable)" do
      m = Proc.meminfo(read!("proc/centos7-v1-limited/proc/meminfo"))
      assert m["MemTotal"] == kib(32_779_820)
      refute Map.has_key?(m, "KReclaimable")
    end

    test "parses the live /proc/meminfo the same way free(1) does" do
      m = Proc.meminfo(File.read!("/proc/meminfo"))

      case System.find_executable("free") do
        nil ->
          assert m["MemTotal"] > 0

        free ->
          {out, 0} = System.cmd(free, ["-b"])
          ["Mem:", total | _] = out |> String.split("\n") |> Enum.at(1) |> String.split()
          assert m["MemTotal"] == String.to_integer(total)
      end
    end
  end

  describe "smaps_rollup/1 and status/1" do
    test "skips the [rollup] header and converts to bytes" do
      r = Proc.smaps_rollup(read!("proc/firecracker-v1/proc/self/smaps_rollup"))
      assert r["Rss"] == kib(53_516)
      assert r["Private_Dirty"] == kib(29_244)
      refute Enum.any?(Map.keys(r), &String.contains?(&1, "rollup"))
    end

    test "status/1 reads tab-separated VmRSS (kernels without smaps_rollup)" do
      s = Proc.status(read!("proc/centos7-v1-limited/proc/self/status"))
      assert s["VmRSS"] == kib(1_258_291)
      assert s["RssAnon"] + s["RssFile"] + s["RssShmem"] == s["VmRSS"]
    end
  end

  describe "smaps/1" do
    test "splits per mapping, with pathnames containing spaces" do
      maps = Proc.smaps(read!("smaps/arenas.smaps"))
      memfd = Enum.find(maps, &(&1.path == "/memfd:heft:users (deleted)"))
      assert memfd.size == 64 * 1024 * 1024
      assert memfd.perms == "rw-s"
      assert memfd.fields["Rss"] == 10 * 1024 * 1024
      assert memfd.fields["Private_Dirty"] + memfd.fields["Shared_Dirty"] == 10 * 1024 * 1024
    end

    test "a file mapping: written pages dirty, read pages clean" do
      maps = Proc.smaps(read!("smaps/arenas.smaps"))
      arena = Enum.find(maps, &(&1.path =~ ~r/heft-\d+\.arena$/))
      assert arena.fields["Rss"] == 12 * 1024 * 1024
      assert arena.fields["Private_Dirty"] == 8 * 1024 * 1024
      assert arena.fields["Size"] == arena.size
    end

    test "anonymous mappings have no path; the mappings add up to the rollup" do
      maps = Proc.smaps(read!("proc/firecracker-v1/proc/self/smaps"))
      assert Enum.any?(maps, &(&1.path == nil))
      assert Enum.any?(maps, &(&1.path == "[heap]"))
      rollup = Proc.smaps_rollup(read!("proc/firecracker-v1/proc/self/smaps_rollup"))
      assert maps |> Enum.map(& &1.fields["Rss"]) |> Enum.sum() == rollup["Rss"]
    end

    test "live: this VM's smaps adds up to its smaps_rollup within 5%" do
      # Other tests allocate and free while the files are read: the sum is
      # compared with the rollups read just before and just after it, and
      # read again (up to 10 times) until the two rollups agree.
      {sum, low, high} = live_rss(10)
      assert sum >= low * 0.95 and sum <= high * 1.05, inspect({sum, low, high})
    end
  end

  describe "pressure/1" do
    test "some and full lines, total in microseconds" do
      p = Proc.pressure(read!("proc/systemd-v2-host/proc/pressure/io"))
      assert p.full.avg60 == 25.31
      assert p.some.total_us == 8_765_432_109
    end

    test "a kernel that has only the some line" do
      assert Proc.pressure("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n") ==
               %{some: %{avg10: 0.0, avg60: 0.0, avg300: 0.0, total_us: 0}}
    end
  end

  describe "cgroup files" do
    test "membership: v2 line and v1 controller lists" do
      m = Proc.cgroup_membership(read!("proc/centos7-v1-limited/proc/self/cgroup"))
      assert m.v2 == nil
      assert m.v1["memory"] =~ ~r{^/docker/9d7e}
      assert m.v1["net_cls"] == m.v1["memory"]

      assert Proc.cgroup_membership("0::/system.slice/heft.service\n").v2 ==
               "/system.slice/heft.service"
    end

    test "mounts: cgroup and cgroup2 only, with their roots and controllers" do
      mounts = Proc.cgroup_mounts(read!("proc/centos7-v1-limited/proc/self/mountinfo"))
      memory = Enum.find(mounts, &("memory" in &1.controllers))
      assert memory.mount == "/sys/fs/cgroup/memory"
      assert memory.root =~ ~r{^/docker/}
      assert Enum.all?(mounts, &(&1.version == 1))

      [v2] = Proc.cgroup_mounts(read!("proc/systemd-v2-host/proc/self/mountinfo"))
      assert v2 == %{version: 2, root: "/", mount: "/sys/fs/cgroup", controllers: []}
    end

    test "mount points with escaped spaces" do
      line = "40 31 0:37 / /mnt/my\\040cgroup rw - cgroup2 cgroup2 rw\n"
      assert [%{mount: "/mnt/my cgroup"}] = Proc.cgroup_mounts(line)
    end

    test "single values: integers and max" do
      assert Proc.value("2147483648\n") == 2_147_483_648
      assert Proc.value("max\n") == :max
      assert Proc.value("garbage") == nil
    end

    test "flat keyed memory.stat" do
      s = Proc.flat_keyed(read!("proc/docker-v2-limited/sys/fs/cgroup/memory.stat"))
      assert s["file_dirty"] == 1_048_576
      assert s["inactive_file"] == 83_886_080
    end
  end

  defp live_rss(tries) do
    rollup = fn -> Proc.smaps_rollup(File.read!("/proc/self/smaps_rollup"))["Rss"] end
    before = rollup.()
    sum = Proc.smaps(File.read!("/proc/self/smaps")) |> Enum.map(& &1.fields["Rss"]) |> Enum.sum()
    later = rollup.()

    if tries > 1 and abs(later - before) > before * 0.01,
      do: live_rss(tries - 1),
      else: {sum, min(before, later), max(before, later)}
  end
end
