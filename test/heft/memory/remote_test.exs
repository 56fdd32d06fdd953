defmodule Heft.Memory.RemoteTest do
  # Reporting on another node over distribution, both ways: a peer without
  # Heft (plain OTP calls over :erpc) and a peer with Heft.Memory loaded
  # (its own snapshot/0). Peers are started with OTP's :peer on this host.
  use ExUnit.Case, async: false

  import ExUnit.CaptureIO
  alias Heft.Memory.Remote

  setup_all do
    started =
      if Node.alive?() do
        false
      else
        # A fresh machine (CI) has no epmd running until some node starts
        # one; Node.start/2 does not, so start it here (a no-op if it runs).
        {_, 0} = System.cmd(epmd(), ["-daemon"])

        {:ok, _} =
          Node.start(:"heft_remote_test_#{System.unique_integer([:positive])}", :shortnames)

        true
      end

    on_exit(fn -> if started, do: Node.stop() end)
    :ok
  end

  defp epmd do
    erts_bin = Path.join([:code.root_dir(), "erts-#{:erlang.system_info(:version)}", "bin"])
    System.find_executable("epmd") || Path.join(erts_bin, "epmd")
  end

  defp peer(args) do
    {:ok, pid, node} = :peer.start(%{name: :peer.random_name(~c"heft_peer"), args: args})
    on_exit(fn -> :peer.stop(pid) end)
    node
  end

  # A named table on the peer that outlives the :erpc call creating it:
  # a sleeping process there inherits it.
  defp remote_table(node, name, records) do
    owner = Node.spawn(node, :timer, :sleep, [:infinity])
    ^name = :erpc.call(node, :ets, :new, [name, [:named_table, :public, {:heir, owner, nil}]])
    true = :erpc.call(node, :ets, :insert, [name, records])
  end

  test "a node without Heft: the OTP parts, Heft unavailable" do
    node = peer([])
    remote_table(node, :remote_big, for(i <- 1..100_000, do: {i, i}))
    refute :erpc.call(node, :code, :is_loaded, [Heft.Memory])

    s = Remote.snapshot(node)
    assert s.node_name == node
    assert s.tables.heft == nil and s.node.heft == nil
    assert {:info, :heft_unavailable, _} = List.keyfind(s.warnings, :heft_unavailable, 1)

    # The peer's own figures, not ours.
    assert s.node.os_pid == List.to_integer(:erpc.call(node, :os, :getpid, []))
    assert s.node.os_pid != String.to_integer(System.pid())
    big = Enum.find(s.tables.ets, &(&1.name == :remote_big))
    assert big.size == 100_000
    assert big.bytes == :erpc.call(node, :ets, :info, [:remote_big, :memory]) * 8
    assert s.host.mem_total == Heft.Memory.host().mem_total
    p = s.node.parts
    assert p.erlang + p.erlang_free + p.files + p.unexplained == s.node.rss
    assert p.heft_index == 0 and p.heft_arenas == 0
  end

  test "a node with Heft.Memory loaded answers with its own snapshot" do
    # An Elixir node with Heft on its code path.
    paths = [Mix.Project.compile_path(), Path.join(:code.lib_dir(:elixir), "ebin")]
    node = peer(Enum.flat_map(paths, &[~c"-pa", String.to_charlist(&1)]))
    remote_table(node, :remote_small, [{1, :a}])
    # A Heft table there, kept alive by an heir as the ETS one is.
    owner = Node.spawn(node, :timer, :sleep, [:infinity])
    :erpc.call(node, Heft, :new, [:remote_heft, [:named_table, :public, {:heir, owner, nil}]])
    true = :erpc.call(node, Heft, :insert, [:remote_heft, for(i <- 1..1000, do: {i, "v#{i}"})])

    s = Remote.snapshot(node)
    assert :erpc.call(node, :code, :is_loaded, [Heft.Memory]) != false
    assert s.node_name == node
    assert Enum.any?(s.tables.ets, &(&1.name == :remote_small))
    [heft] = s.tables.heft
    assert heft.name == :remote_heft and heft.size == 1000
    assert s.node.heft.memory == heft.memory
  end

  test "mix heft.report --node prints the peer's report" do
    node = peer([])
    remote_table(node, :remote_report, [{1, :a}])
    out = capture_io(fn -> Mix.Tasks.Heft.Report.run(["--node", Atom.to_string(node)]) end)
    assert out =~ "Heft memory report: #{node}"
    assert out =~ "remote_report"
    assert out |> String.split("\n") |> Enum.all?(&(String.length(&1) <= 80))
  end

  test "a node where Heft.Memory is on the path but cannot run (no Elixir): the OTP parts" do
    node = peer([~c"-pa", String.to_charlist(Mix.Project.compile_path())])
    s = Remote.snapshot(node)
    assert s.node_name == node
    assert s.tables.heft == nil
  end

  test "an unreachable node is an error, not a hang or a crash" do
    assert {:error, msg} =
             Remote.connect("heft_no_such_node_#{System.unique_integer([:positive])}", nil)

    assert msg =~ "cannot connect"
  end
end
