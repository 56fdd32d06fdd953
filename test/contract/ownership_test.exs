defmodule Heft.Contract.OwnershipTest do
  @moduledoc """
  Ownership: owner death, heirs, give_away/3, protection levels seen from
  other processes, named tables across processes.

  The transfer message differs by backend on purpose: {:"ETS-TRANSFER", ...}
  for :ets, {:"HEFT-TRANSFER", ...} for Heft (`transfer_tag/1`). The table in
  the message is what new/2 returned (the name, for a named table).

  'Dead' means dead when the owner's 'DOWN' message has arrived: ETS has
  deleted (or handed over) the table by then, and a supervisor that restarts
  the owner relies on it to create the named table again at once.
  """
  use Heft.Contract.Case, async: true

  # Calls (from Heft.Contract.all_calls/2) by the access they need.
  @reads [:lookup, :lookup_element, :member, :first, :next, :foldl, :tab2list]
  @writes [
    :insert,
    :insert_new,
    :take,
    :delete_key,
    :delete_object,
    :delete_all_objects,
    :update_counter,
    :update_counter_default,
    :update_element
  ]

  # A table holding {1, 1} and {2, 2}, created (so owned) by a helper process.
  defp owned_by_helper(m, opts, name \\ unique_name()) do
    owner = start_process()

    {:ok, tab} =
      run_in(owner, fn ->
        tab = new(m, name, opts)
        m.insert(tab, [{1, 1}, {2, 2}])
        tab
      end)

    {owner, tab}
  end

  # What each call of Heft.Contract.all_calls/2 gives (:ok or :raise) when
  # made by another process. Each call runs in a fresh process against a
  # fresh table, so that successful writes do not change what the next sees.
  defp access_from_other(m, protection) do
    for {call, _} <- all_calls(m, :unused), into: %{} do
      tab = new_with(m, [{1, 1}, {2, 2}], [protection])
      result = in_other_process(Keyword.fetch!(all_calls(m, tab), call))
      {call, elem(result, 0)}
    end
  end

  defp expect(calls, result), do: Map.new(calls, &{&1, result})

  defp assert_deleted(m, tab) do
    assert m.info(tab) == :undefined
    assert_raise ArgumentError, fn -> m.lookup(tab, 1) end
    refute tab in m.all()
  end

  describe "owner death" do
    for how <- [:stop, :kill] do
      contract "deletes an unnamed table (owner exits by #{how})" do
        {owner, tab} = owned_by_helper(m, [:public])
        assert m.lookup(tab, 1) == [{1, 1}]
        stop(owner, unquote(how))
        assert_deleted(m, tab)
      end

      contract "deletes a named table and frees the name at once (owner exits by #{how})" do
        name = unique_name()
        {owner, ^name} = owned_by_helper(m, [:named_table], name)
        stop(owner, unquote(how))
        assert_deleted(m, name)
        assert m.whereis(name) == :undefined
        assert new(m, name, [:named_table]) == name
        assert m.lookup(name, 1) == []
      end
    end

    contract "with an heir: the heir owns it, gets the transfer message, data intact" do
      me = self()
      {owner, tab} = owned_by_helper(m, [{:heir, me, {:heir_data, [1, 2]}}])
      stop(owner, :kill)
      tag = transfer_tag(m)
      assert_receive {^tag, ^tab, ^owner, {:heir_data, [1, 2]}}
      assert m.info(tab, :owner) == me
      assert m.info(tab, :heir) == me
      assert contents(m, tab) == [{1, 1}, {2, 2}]
      assert m.insert(tab, {3, 3}) == true
    end

    contract "with an heir, a named table keeps its name; the message carries the name" do
      me = self()
      name = unique_name()
      {owner, ^name} = owned_by_helper(m, [:named_table, {:heir, me, :named}], name)
      stop(owner)
      tag = transfer_tag(m)
      assert_receive {^tag, ^name, ^owner, :named}
      assert m.lookup(name, 2) == [{2, 2}]
      assert m.whereis(name) != :undefined
      m.delete(name)
    end

    contract "heir already dead when the owner dies: the table is deleted" do
      heir = start_process()
      {owner, tab} = owned_by_helper(m, [{:heir, heir, :data}])
      stop(heir)
      # What info(tab, :heir) says now differs (differences_test.exs, 10).
      stop(owner)
      assert_deleted(m, tab)
    end

    contract "heir given as an already dead pid: accepted, and the table is deleted with its owner" do
      {owner, tab} = owned_by_helper(m, [{:heir, dead_pid(), :data}])
      stop(owner)
      assert_deleted(m, tab)
    end

    contract "heir is the owner itself: the table is deleted with it" do
      owner = start_process()
      {:ok, tab} = run_in(owner, fn -> new(m, [{:heir, self(), :data}]) end)
      assert m.info(tab, :heir) == owner
      stop(owner)
      assert_deleted(m, tab)
    end

    contract "an heir that inherited and then dies passes the table on to nobody" do
      heir = start_process()
      {owner, tab} = owned_by_helper(m, [{:heir, heir, :data}])
      stop(owner)
      assert {:ok, ^heir} = run_in(heir, fn -> m.info(tab, :owner) end)
      stop(heir)
      assert_deleted(m, tab)
    end
  end

  describe "give_away/3" do
    contract "hands the table over: message to the new owner, owner changes" do
      tab = new_with(m, {1, :a})
      receiver = start_process()
      assert m.give_away(tab, receiver, {:gift, 1}) == true
      assert m.info(tab, :owner) == receiver
      tag = transfer_tag(m)
      me = self()

      assert {:ok, {^tag, ^tab, ^me, {:gift, 1}}} =
               run_in(receiver, fn -> receive(do: (msg -> msg), after: (1_000 -> :no_message)) end)

      # protected: the old owner may read but no longer write, the new one writes
      assert m.lookup(tab, 1) == [{1, :a}]
      assert_raise ArgumentError, fn -> m.insert(tab, {2, :b}) end
      assert {:ok, true} = run_in(receiver, fn -> m.insert(tab, {2, :b}) end)
      assert_raise ArgumentError, fn -> m.give_away(tab, receiver, :again) end
      stop(receiver)
      assert_deleted(m, tab)
    end

    contract "a named table: the message carries the name; the heir setting survives" do
      name = unique_name()
      me = self()
      new(m, name, [:named_table, {:heir, me, :come_back}])
      receiver = start_process()
      assert m.give_away(name, receiver, :gift) == true
      assert m.info(name, :heir) == me
      tag = transfer_tag(m)

      assert {:ok, {^tag, ^name, ^me, :gift}} =
               run_in(receiver, fn -> receive(do: (msg -> msg), after: (1_000 -> :no_message)) end)

      stop(receiver)
      assert_receive {^tag, ^name, ^receiver, :come_back}
      assert m.info(name, :owner) == me
      m.delete(name)
    end

    contract "to the owner itself, to a dead pid, to a non-pid: raises, nothing changes" do
      tab = new(m)
      assert_raise ArgumentError, fn -> m.give_away(tab, self(), :x) end
      assert_raise ArgumentError, fn -> m.give_away(tab, dead_pid(), :x) end
      assert_raise ArgumentError, fn -> m.give_away(tab, :not_a_pid, :x) end
      assert_raise ArgumentError, fn -> m.give_away(tab, "pid", :x) end
      assert m.info(tab, :owner) == self()
      refute_receive _
    end

    for protection <- [:public, :protected, :private] do
      contract "from a process that is not the owner raises (#{protection})" do
        tab = new(m, [unquote(protection)])
        other = start_process()
        assert {:raise, ArgumentError} = run_in(other, fn -> m.give_away(tab, other, :x) end)
        assert {:raise, ArgumentError} = run_in(other, fn -> m.give_away(tab, self(), :x) end)
        assert m.info(tab, :owner) == self()
        stop(other)
      end
    end

    contract "a private table given away: the new owner reads it, the old one cannot" do
      tab = new_with(m, {1, :secret}, [:private])
      receiver = start_process()
      m.give_away(tab, receiver, nil)
      assert {:ok, [{1, :secret}]} = run_in(receiver, fn -> m.lookup(tab, 1) end)
      assert_raise ArgumentError, fn -> m.lookup(tab, 1) end
      stop(receiver)
    end
  end

  describe "protection seen from another process" do
    # What another process may do, by protection. Only the owner may give a
    # table away; on OTP 25 any process may rename or delete a public table.
    for {protection, read, write, rename_delete} <- [
          {:public, :ok, :ok, :ok},
          {:protected, :ok, :raise, :raise},
          {:private, :raise, :raise, :raise}
        ] do
      contract "#{protection}: others' reads #{read}, writes #{write}, rename/delete #{rename_delete}" do
        expected =
          expect(@reads, unquote(read))
          |> Map.merge(expect(@writes, unquote(write)))
          |> Map.merge(expect([:rename, :delete_table], unquote(rename_delete)))
          |> Map.put(:give_away, :raise)

        assert access_from_other(m, unquote(protection)) == expected
      end
    end

    for protection <- [:public, :protected, :private] do
      contract "info/1,2 works from other processes (#{protection})" do
        tab = new_with(m, {1}, [unquote(protection)])
        assert {:ok, 1} = in_other_process(fn -> m.info(tab, :size) end)
        assert {:ok, info} = in_other_process(fn -> m.info(tab) end)
        assert info[:protection] == unquote(protection)
      end
    end

    contract "a protected table's writes by its owner are seen by readers at once" do
      tab = new(m)
      reader = start_process()

      for i <- 1..50 do
        m.insert(tab, {i, i})
        assert {:ok, [{^i, ^i}]} = run_in(reader, fn -> m.lookup(tab, i) end)
      end

      stop(reader)
    end
  end

  describe "setopts/2 of the protection" do
    # What another process may do after the owner changes the protection
    # from each level to each other.
    for from <- [:public, :protected, :private], to <- [:public, :protected, :private] do
      contract "#{from} set to #{to}: others' reads and writes follow" do
        tab = new_with(m, [{1, 1}], [unquote(from)])
        assert m.setopts(tab, {:protection, unquote(to)}) == true
        assert m.info(tab, :protection) == unquote(to)
        read = in_other_process(fn -> m.lookup(tab, 1) end)
        write = in_other_process(fn -> m.insert(tab, {2, 2}) end)

        case unquote(to) do
          :public -> assert {{:ok, [{1, 1}]}, {:ok, true}} = {read, write}
          :protected -> assert {{:ok, [{1, 1}]}, {:raise, ArgumentError}} = {read, write}
          :private -> assert {{:raise, ArgumentError}, {:raise, ArgumentError}} = {read, write}
        end
      end
    end

    contract "a list of options; a bad one, or one given twice, sets none" do
      tab = new(m, [:private])
      assert m.setopts(tab, [{:heir, self(), :data}, {:protection, :protected}])
      assert {m.info(tab, :protection), m.info(tab, :heir)} == {:protected, self()}

      assert_raise ArgumentError, fn ->
        m.setopts(tab, [{:protection, :public}, {:protection}])
      end

      assert_raise ArgumentError, fn -> m.setopts(tab, [{:protection, :public}, :x]) end

      assert_raise ArgumentError, fn ->
        m.setopts(tab, [{:protection, :public}, {:protection, :private}])
      end

      assert_raise ArgumentError, fn -> m.setopts(tab, [{:heir, :none}, {:heir, :none}]) end
      assert {m.info(tab, :protection), m.info(tab, :heir)} == {:protected, self()}

      for bad <- [
            {:protection},
            {:protection, false},
            {:protection, :private, false},
            :protection
          ] do
        assert_raise ArgumentError, fn -> m.setopts(tab, bad) end
      end
    end

    contract "only the owner may change it, even of a public table" do
      tab = new(m, [:public])

      assert {:raise, ArgumentError} =
               in_other_process(fn -> m.setopts(tab, {:protection, :private}) end)

      assert m.info(tab, :protection) == :public
    end
  end

  describe "named tables across processes" do
    contract "other processes reach a named table by name; whereis agrees" do
      name = unique_name()
      new(m, name, [:named_table, :public])
      m.insert(name, {1, :mine})
      id = m.whereis(name)
      assert {:ok, [{1, :mine}]} = in_other_process(fn -> m.lookup(name, 1) end)
      assert {:ok, true} = in_other_process(fn -> m.insert(name, {2, :theirs}) end)
      assert {:ok, ^id} = in_other_process(fn -> m.whereis(name) end)
      assert m.lookup(name, 2) == [{2, :theirs}]
      m.delete(name)
    end

    contract "a rename is seen by other processes" do
      old = unique_name()
      new_name = unique_name()
      new(m, old, [:named_table])
      m.rename(old, new_name)
      assert {:ok, []} = in_other_process(fn -> m.lookup(new_name, 1) end)
      assert {:raise, ArgumentError} = in_other_process(fn -> m.lookup(old, 1) end)
      assert {:ok, :undefined} = in_other_process(fn -> m.whereis(old) end)
      m.delete(new_name)
    end

    contract "a table created by another process under a name is visible to all" do
      name = unique_name()
      {owner, ^name} = owned_by_helper(m, [:named_table], name)
      assert m.lookup(name, 1) == [{1, 1}]
      assert m.info(name, :owner) == owner
      assert_raise ArgumentError, fn -> m.insert(name, {2}) end
      stop(owner)
      assert m.whereis(name) == :undefined
    end
  end
end
