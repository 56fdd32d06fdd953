defmodule Heft.Test.Fixtures do
  # Paths to test/fixtures. Each directory under test/fixtures/proc is a
  # machine laid out like / (see test/fixtures/proc/capture.exs):
  #   firecracker-v1      this machine, captured: cgroup v1 memory, no limit,
  #                       no swap, PSI present
  #   docker-v2-limited   cgroup v2 (namespaced), 2 GiB limit, swap in use
  #   centos7-v1-limited  cgroup v1 under /docker/<id>, 4 GiB limit, no swap,
  #                       no PSI, no smaps_rollup, dirty budget in bytes
  #   chroot-nocgroup     no cgroup filesystem, no swap, no PSI
  #   systemd-v2-host     cgroup v2 with the limit on an ancestor slice, swap
  #                       unused, heavy I/O pressure and dirty page cache
  @moduledoc false

  @root Path.expand("../fixtures", __DIR__)

  def machine(name), do: Path.join([@root, "proc", name])
  def file(rel), do: Path.join(@root, rel)
  def read!(rel), do: File.read!(file(rel))

  def machines,
    do: ~w(firecracker-v1 docker-v2-limited centos7-v1-limited chroot-nocgroup systemd-v2-host)

  @kib 1024
  def kib(n), do: n * @kib
end
