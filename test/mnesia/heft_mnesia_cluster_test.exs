defmodule Heft.MnesiaClusterTest do
  # heft_mnesia replicated over two child VMs on this machine (distributed
  # among themselves, driven from this VM over their standard I/O), each
  # with its own Mnesia directory: replication in transactions, and a
  # replica killed with SIGKILL while the other writes and deletes, which
  # must end equal to it after its restart (it reloads from its peer: keys
  # deleted meanwhile gone, indexes right; mnesia_rocksdb#68's trap).
  use ExUnit.Case, async: false

  alias Heft.Test.MnesiaNode

  @moduletag :mnesia
  @moduletag :tmp_dir
  @moduletag :capture_log

  setup do
    {_, 0} = System.cmd("epmd", ["-daemon"])
    :ok
  end

  for alias <- [:heft_copies, :heft_ram_copies] do
    test "#{alias}: a replica killed while its peer writes and deletes reloads equal to it",
         %{tmp_dir: tmp} do
      alias = unquote(alias)
      suffix = System.unique_integer([:positive])
      cookie = ~c"heft#{suffix}"
      names = [:"hm_a#{suffix}", :"hm_b#{suffix}"]
      dirs = for n <- names, do: Path.join(tmp, Atom.to_string(n))

      [a, b] = vms = for n <- names, do: child(n, cookie)
      [na, nb] = nodes = for vm <- vms, do: call(vm, :erlang, :node, [])
      true = call(a, :net_kernel, :connect_node, [nb])
      for {vm, dir} <- Enum.zip(vms, dirs), do: :ok = call(vm, MnesiaNode, :set_dir, [dir])
      :ok = call(a, MnesiaNode, :create_schema, [nodes])
      for vm <- vms, do: :ok = call(vm, :mnesia, :start, [])

      {:atomic, :ok} =
        call(a, :mnesia, :create_table, [
          :rep,
          [{alias, nodes}, {:type, :ordered_set}, {:attributes, [:k, :v]}, {:index, [:v]}]
        ])

      # Replication: what one node commits, the other reads.
      {:atomic, :ok} =
        call(a, MnesiaNode, :write_all, [for(i <- 1..300, do: {:rep, i, rem(i, 4)})])

      {:atomic, :ok} = call(b, MnesiaNode, :write_all, [[{:rep, 1000, 0}]])
      assert call(b, MnesiaNode, :all, [:rep]) == call(a, MnesiaNode, :all, [:rep])
      assert call(b, :mnesia, :dirty_read, [:rep, 7]) == [{:rep, 7, 3}]

      # b dies; a deletes, updates and writes while it is away.
      os_pid = call(b, MnesiaNode, :os_pid, [])
      ref = Process.monitor(b)
      {_, 0} = System.cmd("kill", ["-9", Integer.to_string(os_pid)])
      assert_receive {:DOWN, ^ref, _, _, _}, 10_000

      {:atomic, :ok} = call(a, MnesiaNode, :delete_all, [:rep, Enum.to_list(1..100)])

      {:atomic, :ok} =
        call(a, MnesiaNode, :write_all, [for(i <- 101..150, do: {:rep, i, :moved})])

      {:atomic, :ok} = call(a, MnesiaNode, :write_all, [for(i <- 301..350, do: {:rep, i, 1})])
      :ok = call(a, :mnesia, :dirty_delete, [:rep, 1000])

      # b comes back, with its own (stale) directory.
      b = child(Enum.at(names, 1), cookie)
      ^nb = call(b, :erlang, :node, [])
      :ok = call(b, MnesiaNode, :set_dir, [Enum.at(dirs, 1)])
      true = call(b, :net_kernel, :connect_node, [na])
      :ok = call(b, :mnesia, :start, [])
      :ok = call(b, MnesiaNode, :wait, [[:rep]])

      expected = call(a, MnesiaNode, :all, [:rep])
      {:atomic, rows} = expected
      assert length(rows) == 250
      assert call(b, MnesiaNode, :all, [:rep]) == expected
      assert call(b, :mnesia, :dirty_read, [:rep, 50]) == []
      assert call(b, :mnesia, :dirty_read, [:rep, 1000]) == []

      for v <- [0, 1, 2, 3, :moved] do
        assert call(b, MnesiaNode, :index_keys, [:rep, v, :v]) ==
                 call(a, MnesiaNode, :index_keys, [:rep, v, :v])
      end

      assert call(b, MnesiaNode, :index_keys, [:rep, :moved, :v]) == Enum.to_list(101..150)

      for vm <- [a, b], do: :peer.stop(vm)
    end
  end

  # A distributed child VM (short name `name`, this machine), driven over
  # its standard I/O.
  defp child(name, cookie) do
    args = [~c"-setcookie", cookie | Enum.flat_map(:code.get_path(), &[~c"-pa", &1])]

    {:ok, vm} =
      case :peer.start(%{name: name, connection: :standard_io, args: args}) do
        {:ok, vm} -> {:ok, vm}
        {:ok, vm, _node} -> {:ok, vm}
      end

    {:ok, _} = :peer.call(vm, :application, :ensure_all_started, [:elixir])
    vm
  end

  defp call(vm, m, f, a), do: :peer.call(vm, m, f, a, 60_000)
end
