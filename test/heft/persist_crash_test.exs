defmodule Heft.PersistCrashTest do
  # A writer in another OS process is killed with SIGKILL at random moments,
  # often in the middle of a dump (its dump threshold is tiny). After each
  # kill the table is reopened here: every batch the writer saw
  # acknowledged (sync: :commit, or sync: :none: a VM crash loses nothing
  # either way) must be there, no batch may be half there,
  # and the counter must be at least the last value it saw. The directory
  # carries over from round to round, so each round also recovers from the
  # previous rounds' leftovers. With 40 MB batches, nearly every batch
  # moves the log to a new segment, so kills land while one segment is
  # sealed and the next written: every reopen must succeed without repair.
  use ExUnit.Case, async: true
  import Bitwise

  # Each round boots a VM: slow on a loaded machine.
  @moduletag timeout: 600_000

  @child Path.expand("../support/persist_crash_child.exs", __DIR__)

  @moduletag :tmp_dir

  test "acknowledged commits survive SIGKILL, batches are atomic", %{tmp_dir: tmp} do
    rounds(Path.join(tmp, "t"), 4)
  end

  test "acknowledged sync: :none writes survive SIGKILL (their frames are in the page cache)",
       %{tmp_dir: tmp} do
    rounds(Path.join(tmp, "t"), 4, "none")
  end

  test "acknowledged writes survive SIGKILL while dictionaries are trained and records re-compressed",
       %{tmp_dir: tmp} do
    dir = Path.join(tmp, "t")
    rounds(dir, 4, "none train")
    {:ok, tab} = Heft.open(dir)
    # The kills did land on a table using its dictionaries.
    assert [_ | _] = Heft.info(tab, :dictionaries)
    assert Heft.info(tab, :records_by_codec).zstd_dict > 0
    :ok = Heft.close(tab)
  end

  test "acknowledged writes survive SIGKILL while the table compacts and dumps", %{tmp_dir: tmp} do
    dir = Path.join(tmp, "t")
    rounds(dir, 4, "none compact")
    # (run_child/4 adds up what the children's compactions moved.)
    assert Process.get(:moved_records) > 0
    {:ok, tab} = Heft.open(dir)
    # The junk of a killed round is whole or absent; never half a record.
    for {{:junk, _}, _, bytes} <- Heft.tab2list(tab), do: assert(byte_size(bytes) == 2000)
    :ok = Heft.close(tab)
  end

  test "SIGKILL while the log moves to a new segment under 40 MB batches: every open succeeds without repair",
       %{tmp_dir: tmp} do
    # Nearly every batch fills a segment, so kills land between sealing
    # the full segment and writing the frame to the next one.
    dir = Path.join(tmp, "t")

    for round <- 1..12 do
      {acks, _} = run_child(dir, round * 1_000_000, Enum.random(300..1500), "none big")
      check_big(dir, acks, round)
    end
  end

  @tag :slow
  @tag timeout: :infinity
  test "many rounds of SIGKILL", %{tmp_dir: tmp} do
    rounds(Path.join(tmp, "t"), 60)
  end

  defp rounds(dir, n, sync \\ "commit") do
    for round <- 1..n do
      {acks, ctr} = run_child(dir, round * 1_000_000, Enum.random(50..1200), sync)
      check(dir, acks, ctr, round)
    end
  end

  defp run_child(dir, first, kill_after_ms, sync) do
    elixir = System.find_executable("elixir")
    ebin = Path.join(Mix.Project.build_path(), "lib/heft/ebin")

    port =
      Port.open({:spawn_executable, elixir}, [
        :binary,
        :exit_status,
        {:line, 256},
        args: ["-pa", ebin, @child, dir, Integer.to_string(first) | String.split(sync)]
      ])

    {:os_pid, os_pid} = Port.info(port, :os_pid)
    # Wait until the table is open (or a VM boot failed), then let it write.
    wait_ready(port)
    Process.sleep(kill_after_ms)
    {_, 0} = System.cmd("kill", ["-9", Integer.to_string(os_pid)])
    {acks, ctr, moved} = collect(port, MapSet.new(), 0, 0)
    Process.put(:moved_records, Process.get(:moved_records, 0) + moved)
    {acks, ctr}
  end

  defp wait_ready(port) do
    receive do
      {^port, {:data, {:eol, "ready"}}} -> :ok
      {^port, {:data, _}} -> wait_ready(port)
      {^port, {:exit_status, s}} -> flunk("the child exited with #{s} before opening")
    after
      60_000 -> flunk("the child did not open the table within 60 s")
    end
  end

  # What the child printed before it died: the batches acknowledged, the
  # highest counter value, and the records its compactions moved.
  defp collect(port, acks, ctr, moved) do
    receive do
      {^port, {:data, {:eol, "ack " <> b}}} ->
        collect(port, MapSet.put(acks, String.to_integer(b)), ctr, moved)

      {^port, {:data, {:eol, "big " <> b}}} ->
        collect(port, MapSet.put(acks, String.to_integer(b)), ctr, moved)

      {^port, {:data, {:eol, "ctr " <> c}}} ->
        collect(port, acks, max(ctr, String.to_integer(c)), moved)

      {^port, {:data, {:eol, "moved " <> n}}} ->
        collect(port, acks, ctr, moved + String.to_integer(n))

      {^port, {:data, _}} ->
        collect(port, acks, ctr, moved)

      {^port, {:exit_status, _}} ->
        {acks, ctr, moved}
    after
      30_000 -> flunk("the child's output did not end after SIGKILL")
    end
  end

  # The "big" child's table: opens without repair, holds the last batch
  # acknowledged or a later one, whole.
  defp check_big(dir, acks, round) do
    tab =
      case Heft.open(dir) do
        {:ok, tab} -> tab
        {:error, reason} -> flunk("round #{round}: open refused: #{inspect(reason)}")
      end

    b =
      case Heft.lookup(tab, :big_count) do
        [{:big_count, b}] -> b
        [] -> 0
      end

    assert b >= Enum.max(acks, fn -> 0 end), "round #{round}: acknowledged batches are missing"

    for j <- 1..40, b > 0 do
      assert [{{:big, ^j}, ^b, bytes}] = Heft.lookup(tab, {:big, j}),
             "round #{round}: batch #{b} is half there (record #{j})"

      assert byte_size(bytes) == 1 <<< 20
    end

    :ok = Heft.close(tab)
  end

  # What test/support/persist_crash_child.exs stores in batch `b`.
  defp value(b),
    do:
      ~s({"user":"user-#{b}","mail":"user#{b}@example.com","pad":") <>
        :binary.copy("v", rem(b, 300)) <> ~s("})

  defp check(dir, acks, ctr, round) do
    {:ok, tab} = Heft.open(dir)
    rows = Heft.tab2list(tab)
    counts = for {{:count, b}, n} <- rows, into: %{}, do: {b, n}
    present = for {{:b, b, j}, _} <- rows, into: MapSet.new(), do: {b, j}

    for b <- acks do
      assert Map.has_key?(counts, b), "round #{round}: acknowledged batch #{b} is missing"
    end

    for {b, n} <- counts, j <- 1..n do
      assert {b, j} in present, "round #{round}: batch #{b} is half there (no record #{j})"
    end

    for {b, _j} <- present do
      assert Map.has_key?(counts, b), "round #{round}: records of batch #{b} without its count"
    end

    # Every value reads back as written (with the dictionary it names).
    for {{:b, b, j}, v} <- rows, v != value(b) do
      flunk("round #{round}: record #{inspect({b, j})} reads back as #{inspect(v)}")
    end

    case Heft.lookup(tab, :total) do
      [{:total, total}] -> assert total >= ctr, "round #{round}: counter #{total} < #{ctr}"
      [] -> assert ctr == 0
    end

    assert MapSet.size(acks) > 0 or round > 0
    :ok = Heft.close(tab)
  end
end
