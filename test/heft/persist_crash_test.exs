defmodule Heft.PersistCrashTest do
  # A writer in another OS process is killed with SIGKILL at random moments,
  # often in the middle of a dump (its dump threshold is tiny). After each
  # kill the table is reopened here: every batch the writer saw
  # acknowledged (sync: :commit, or sync: :none: a VM crash loses nothing
  # either way) must be there, no batch may be half there,
  # and the counter must be at least the last value it saw. The directory
  # carries over from round to round, so each round also recovers from the
  # previous rounds' leftovers.
  use ExUnit.Case, async: true

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
    collect(port, MapSet.new(), 0)
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

  defp collect(port, acks, ctr) do
    receive do
      {^port, {:data, {:eol, "ack " <> b}}} ->
        collect(port, MapSet.put(acks, String.to_integer(b)), ctr)

      {^port, {:data, {:eol, "ctr " <> c}}} ->
        collect(port, acks, max(ctr, String.to_integer(c)))

      {^port, {:data, _}} ->
        collect(port, acks, ctr)

      {^port, {:exit_status, _}} ->
        {acks, ctr}
    after
      30_000 -> flunk("the child's output did not end after SIGKILL")
    end
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
