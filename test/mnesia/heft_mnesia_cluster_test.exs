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

      # A continuation of select/4 crosses nodes (Mnesia sends them by
      # RPC): begun on a, continued on b's replica.
      ms = [{{:rep, :"$1", :_}, [], [:"$1"]}]
      {first, cont} = call(a, :heft_mnesia, :select, [alias, :rep, ms, 120])
      assert first == Enum.to_list(1..120)
      {second, cont} = call(b, :heft_mnesia, :select, [cont])
      assert second == Enum.to_list(121..240)
      {third, :"$end_of_table"} = call(a, :heft_mnesia, :select, [cont])
      assert third == Enum.to_list(241..300) ++ [1000]

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

      # A copy removed and added again is sent whole by its peer.
      {:atomic, :ok} = call(a, :mnesia, :del_table_copy, [:rep, nb])
      assert call(b, :heft_mnesia_admin, :tables, []) == []
      {:atomic, :ok} = call(a, :mnesia, :add_table_copy, [:rep, nb, alias])
      assert call(b, MnesiaNode, :all, [:rep]) == expected

      assert call(b, MnesiaNode, :index_keys, [:rep, 3, :v]) ==
               call(a, MnesiaNode, :index_keys, [:rep, 3, :v])

      for vm <- [a, b], do: :peer.stop(vm)
    end
  end

  test "a node removed with del_table_copy(schema, node) rejoins after delete_schema and gets every table again",
       %{tmp_dir: tmp} do
    suffix = System.unique_integer([:positive])
    cookie = ~c"heft#{suffix}"
    names = [:"hm_sa#{suffix}", :"hm_sb#{suffix}"]
    dirs = for n <- names, do: Path.join(tmp, Atom.to_string(n))
    [a, b] = vms = for n <- names, do: child(n, cookie)
    [_na, nb] = nodes = for vm <- vms, do: call(vm, :erlang, :node, [])
    true = call(a, :net_kernel, :connect_node, [nb])
    for {vm, dir} <- Enum.zip(vms, dirs), do: :ok = call(vm, MnesiaNode, :set_dir, [dir])
    :ok = call(a, MnesiaNode, :create_schema, [nodes])
    for vm <- vms, do: :ok = call(vm, :mnesia, :start, [])

    for {tab, alias} <- [disc: :heft_copies, ram: :heft_ram_copies] do
      {:atomic, :ok} =
        call(a, :mnesia, :create_table, [
          tab,
          [{alias, nodes}, {:attributes, [:k, :v]}, {:index, [:v]}]
        ])

      {:atomic, :ok} =
        call(a, MnesiaNode, :write_all, [for(i <- 1..200, do: {tab, i, rem(i, 3)})])
    end

    # b leaves the cluster: its Mnesia stops, a removes it from the schema.
    :stopped = call(b, :mnesia, :stop, [])
    {:atomic, :ok} = call(a, :mnesia, :del_table_copy, [:schema, nb])
    assert call(a, :mnesia, :table_info, [:disc, :heft_copies]) == [node_of(a)]
    assert nb not in call(a, :mnesia, :system_info, [:db_nodes])

    # a goes on without it.
    for tab <- [:disc, :ram] do
      {:atomic, :ok} = call(a, MnesiaNode, :delete_all, [tab, Enum.to_list(1..50)])
      {:atomic, :ok} = call(a, MnesiaNode, :write_all, [for(i <- 51..60, do: {tab, i, :new})])
    end

    # b rejoins as a new node: its stale schema and tables deleted (the
    # .heft directories with them), Mnesia started empty, a adds it.
    b_dir = Enum.at(dirs, 1)
    assert File.dir?(Path.join(b_dir, "disc.heft"))
    :ok = call(b, :mnesia, :delete_schema, [[nb]])
    refute File.exists?(Path.join(b_dir, "disc.heft"))
    :ok = call(b, :mnesia, :start, [])
    # Its fresh schema must name the backends as the cluster's does (in
    # its order: add_backend_type prepends), or
    # Mnesia cannot merge the two.
    for alias <- [:heft_ram_copies, :heft_copies],
        do: {:atomic, :ok} = call(b, :mnesia, :add_backend_type, [alias, :heft_mnesia])

    {:ok, [^nb]} = call(a, :mnesia, :change_config, [:extra_db_nodes, [nb]])
    {:atomic, :ok} = call(a, :mnesia, :change_table_copy_type, [:schema, nb, :disc_copies])
    {:atomic, :ok} = call(a, :mnesia, :add_table_copy, [:disc, nb, :heft_copies])
    {:atomic, :ok} = call(a, :mnesia, :add_table_copy, [:ram, nb, :heft_ram_copies])
    :ok = call(b, MnesiaNode, :wait, [[:disc, :ram]])

    for tab <- [:disc, :ram] do
      expected = call(a, MnesiaNode, :all, [tab])
      {:atomic, rows} = expected
      assert length(rows) == 150
      assert call(b, MnesiaNode, :all, [tab]) == expected
      assert call(b, :mnesia, :dirty_read, [tab, 10]) == []

      assert call(b, MnesiaNode, :index_keys, [tab, :new, :v]) == Enum.to_list(51..60)

      assert call(b, MnesiaNode, :index_keys, [tab, 2, :v]) ==
               call(a, MnesiaNode, :index_keys, [tab, 2, :v])
    end

    # Replication works both ways again, and b's copy survives its restart.
    {:atomic, :ok} = call(b, MnesiaNode, :write_all, [[{:disc, 1000, :from_b}]])
    assert call(a, :mnesia, :dirty_read, [:disc, 1000]) == [{:disc, 1000, :from_b}]
    :stopped = call(b, :mnesia, :stop, [])
    :ok = call(b, :mnesia, :start, [])
    :ok = call(b, MnesiaNode, :wait, [[:disc]])
    assert call(b, MnesiaNode, :all, [:disc]) == call(a, MnesiaNode, :all, [:disc])
    for vm <- vms, do: :peer.stop(vm)
  end

  defp node_of(vm), do: call(vm, :erlang, :node, [])

  # mnesia_frag of OTP 25 cannot place external copies itself
  # ({n_external_copies, _} and add_frag of a table with external
  # fragments fail in mnesia_schema:verify_nodes/1): the fragments are
  # created as ram_copies, then each copy changed to heft_copies.
  test "a table fragmented over 3 nodes as heft_copies: hash-partitioned, read and written from every node",
       %{tmp_dir: tmp} do
    suffix = System.unique_integer([:positive])
    cookie = ~c"heft#{suffix}"
    names = for i <- 1..3, do: :"hm_f#{i}_#{suffix}"
    [a | _] = vms = for n <- names, do: child(n, cookie)
    nodes = for vm <- vms, do: call(vm, :erlang, :node, [])
    for n <- tl(nodes), do: true = call(a, :net_kernel, :connect_node, [n])

    for {vm, n} <- Enum.zip(vms, names),
        do: :ok = call(vm, MnesiaNode, :set_dir, [Path.join(tmp, Atom.to_string(n))])

    :ok = call(a, MnesiaNode, :create_schema, [nodes])
    for vm <- vms, do: :ok = call(vm, :mnesia, :start, [])

    {:atomic, :ok} =
      call(a, :mnesia, :create_table, [
        :fr,
        [
          {:attributes, [:k, :v]},
          {:frag_properties, [n_fragments: 6, node_pool: nodes, n_ram_copies: 1]}
        ]
      ])

    frags = call(a, MnesiaNode, :frag_names, [:fr])
    assert length(frags) == 6

    for f <- frags, n <- call(a, :mnesia, :table_info, [f, :ram_copies]) do
      {:atomic, :ok} = call(a, :mnesia, :change_table_copy_type, [f, n, :heft_copies])
    end

    # Every fragment is a heft_copies table, and the 3 nodes each hold 2.
    holders =
      for f <- frags do
        assert call(a, :mnesia, :table_info, [f, :storage_type]) in [
                 {:ext, :heft_copies, :heft_mnesia},
                 :unknown
               ]

        [{{:heft_copies, :heft_mnesia}, [n]}] =
          call(a, :mnesia, :table_info, [f, :external_copies])

        n
      end

    assert holders |> Enum.frequencies() |> Map.values() == [2, 2, 2]

    records = for i <- 1..600, do: {:fr, i, i * i}

    for {vm, chunk} <- Enum.zip(vms, Enum.chunk_every(records, 200)),
        do: :ok = call(vm, MnesiaNode, :frag_write, [chunk])

    for vm <- vms do
      assert call(vm, MnesiaNode, :frag_all, [:fr]) == records

      assert call(vm, MnesiaNode, :frag_read, [:fr, [7, 300, 599]]) == [
               {:fr, 7, 49},
               {:fr, 300, 90000},
               {:fr, 599, 358_801}
             ]
    end

    # Hash-partitioned: each record is in one fragment, on that fragment's node only.
    sizes =
      for {f, n} <- Enum.zip(frags, holders) do
        vm = Enum.at(vms, Enum.find_index(nodes, &(&1 == n)))
        call(vm, :heft_mnesia, :info, [:heft_copies, f, :size])
      end

    assert Enum.sum(sizes) == 600
    assert Enum.all?(sizes, &(&1 > 0))

    for vm <- vms, do: :peer.stop(vm)
  end

  # A distributed child VM (short name `name`, this machine), driven over
  # its standard I/O.
  defp child(name, cookie), do: MnesiaNode.peer(%{name: name}, [~c"-setcookie", cookie])

  defp call(vm, m, f, a), do: :peer.call(vm, m, f, a, 60_000)
end
