defmodule Heft.ReportTest do
  use ExUnit.Case, async: true

  import Heft.Test.Fixtures
  alias Heft.Memory
  alias Heft.Report

  @gib 1024 * 1024 * 1024

  # A Heft table as Heft.info/1 describes one, with a name too long for its
  # column.
  defp heft_table(name, arena) do
    %{
      name: name,
      owner: self(),
      owner_name: nil,
      size: 12_345_678,
      type: :set,
      memory: 3 * @gib,
      index_bytes: 256 * 1024 * 1024,
      arena: arena,
      arena_mapped_bytes: 4 * @gib,
      arena_live_bytes: 2 * @gib + 700 * 1024 * 1024,
      arena_resident_bytes: 2 * @gib,
      arena_dirty_bytes: 1 * @gib,
      payload_raw_bytes: 20 * @gib,
      payload_stored_bytes: 2 * @gib + 500 * 1024 * 1024,
      compression: :zlib
    }
  end

  defp snapshot(machine) do
    s = Memory.snapshot(root: machine(machine))

    cache =
      Map.put(heft_table(:cache, :memory), :budget, %{
        max_bytes: 4 * @gib,
        max_records: nil,
        used_bytes: 3 * @gib,
        queue_bytes: 64 * 1024 * 1024,
        evicted_keys: 1_234,
        evicted_records: 1_234,
        hits: 98_765,
        misses: 4_321
      })
      |> Map.put(:expiry, %{
        ttl: 60_000,
        expiring_keys: 5_000,
        expired_keys: 777,
        expired_records: 778,
        bytes: 512 * 1024
      })

    tiered =
      heft_table(:tiered, {:file, "/srv/tier/heft-1-tiered-0-ab.arena", memory: 2 * @gib})
      |> Map.put(:tier, %{
        memory_budget: 2 * @gib,
        memory_used_bytes: 2 * @gib,
        memory_live_bytes: 2 * @gib - 1024 * 1024,
        file_used_bytes: 6 * @gib,
        file_live_bytes: 6 * @gib,
        moved_records: 4_321_000,
        moved_bytes: 7 * @gib,
        queue_bytes: 8 * 1024 * 1024,
        file_reads: 98_000,
        file_read_bytes: 300 * 1024 * 1024
      })

    heft = [
      heft_table(:users_by_email_address_and_more, :memory),
      tiered,
      heft_table(:scratch, {:file, "/srv/very/long/path/to/the/heft/scratch/directory"}),
      cache
    ]

    s = put_in(s.tables.heft, heft)
    %{s | warnings: Memory.warnings(s)}
  end

  test "every line fits 80 columns, for every fixture machine" do
    for m <- machines() do
      text = Report.render(snapshot(m))
      lines = String.split(text, "\n", trim: true)
      assert length(lines) > 15, m
      long = Enum.filter(lines, &(String.length(&1) > 80))
      assert long == [], "#{m}: #{inspect(long)}"
    end
  end

  test "and at 60 columns when asked" do
    lines = snapshot("systemd-v2-host") |> Report.render(width: 60) |> String.split("\n")
    assert Enum.all?(lines, &(String.length(&1) <= 60))
  end

  test "the host line: RAM, swap, cgroup, dirty budget, I/O pressure in people's units" do
    text = Report.render(snapshot("docker-v2-limited"))
    assert text =~ "Host   RAM 15.5 GiB, available 9.4 GiB (61%)"
    assert text =~ ~r/swap 812 MiB of\s+4.0 GiB used/
    assert text =~ "cgroup v2 /: limit 2.0 GiB, working set 1.8 GiB (89%)"
    assert text =~ "dirty budget: background 26.7 MiB, throttle 53.5 MiB"
    assert text =~ "I/O pressure (avg60): some 0.85%, full 0.6%"
  end

  test "what is missing is said to be missing" do
    text = Report.render(snapshot("chroot-nocgroup"))
    assert text =~ "cgroup: none limits this process"
    assert text =~ "I/O pressure: n/a"
    assert text =~ "swap none"

    # A node without Heft: both its table list and its native memory nil.
    s = Memory.snapshot()
    nonheft = Report.render(%{s | tables: %{s.tables | heft: nil}, node: %{s.node | heft: nil}})
    assert nonheft =~ "heft: not loaded on this node"
  end

  test "the node line adds up" do
    s = snapshot("firecracker-v1")
    text = Report.render(s)
    assert text =~ "Node   RSS 52.3 MiB = erlang"
    assert text =~ "unexplained"
    assert text =~ "word 8 bytes"
  end

  test "the table of tables, largest first, Heft rows with their breakdown" do
    text = Report.render(snapshot("firecracker-v1"))

    [header | rows] =
      text |> String.split("\n") |> Enum.drop_while(&(not String.starts_with?(&1, "KIND")))

    assert header =~ ~r/^KIND NAME +OWNER +RECORDS +MEMORY +RESIDENT +DIRTY$/
    assert hd(rows) =~ ~r/^heft users_by_email_ad\.\. .* 12345678 +3\.0 GiB +2\.0 GiB +1\.0 GiB$/
    assert text =~ "arena file /srv/very/long/path"
    assert text =~ ~r/payload 20.0 GiB\s+stored as 2.5 GiB \(zlib\)/
    # A bounded table's budget, its evictions and reads.
    assert text =~
             ~r/budget\s+3.0\s+GiB\s+of\s+4.0\s+GiB:\s+1234\s+keys\s+\(1234\s+records\)\s+evicted,\s+98765\s+hits,\s+4321\s+misses/

    # Its expiry.
    assert text =~
             ~r/ttl\s+60000\s+ms:\s+5000\s+keys\s+with\s+a\s+deadline\s+\(512\s+KiB\),\s+777\s+keys\s+\(778\s+records\)\s+expired/

    # A tiered arena: its budget, each tier, what moved out.
    assert text =~ ~r/arena\s+memory\s+up\s+to\s+2.0\s+GiB,\s+then\s+file\s+\/srv\/tier/

    assert text =~
             ~r/in\s+memory\s+2.0\s+GiB\s+live\s+of\s+a\s+2.0\s+GiB\s+budget,\s+in\s+the\s+file\s+6.0\s+GiB;\s+4321000\s+records\s+\(7.0\s+GiB\)\s+moved\s+out,\s+98000\s+\(300\s+MiB\)\s+read\s+back/
  end

  test "warnings, wrapped under their code" do
    text = Report.render(snapshot("systemd-v2-host"))
    assert text =~ ~r{  WARNING dirty_budget: file arenas\s+\(/srv/very/long/path}
    assert text =~ "  WARNING io_pressure:"
    assert text =~ ~r/\n {10}\S/
  end

  test "print/1 writes the rendered report" do
    {:ok, io} = StringIO.open("")
    assert Report.print(device: io, width: 80) == :ok
    {_, out} = StringIO.contents(io)
    assert out =~ "Heft memory report: #{node()}"
    assert out =~ "Tables, largest first"
    s = snapshot("firecracker-v1")
    {:ok, io} = StringIO.open("")
    Report.print(s, device: io)
    assert StringIO.contents(io) |> elem(1) == Report.render(s)
  end

  test "mix heft.report prints this node's report" do
    out = ExUnit.CaptureIO.capture_io(fn -> Mix.Tasks.Heft.Report.run(["--tables", "3"]) end)
    assert out =~ "Heft memory report: #{node()}"
    assert out =~ ~r/\.\.\. \d+ more tables/
    assert_raise Mix.Error, fn -> Mix.Tasks.Heft.Report.run(["--bogus"]) end
  end

  test "top/1 redraws in place and leaves one report behind" do
    {:ok, io} = StringIO.open("")
    assert Report.top(device: io, interval: 0.01, iterations: 3) == :ok
    {_, out} = StringIO.contents(io)
    assert String.starts_with?(out, "\e[?1049h")
    # Three frames, each from the cursor home, none clearing the screen.
    assert length(String.split(out, "\e[H")) - 1 == 3
    refute out =~ "\e[2J"
    [_, after_exit] = String.split(out, "\e[?1049l")
    assert length(String.split(after_exit, "Heft memory report")) - 1 == 1
  end
end
