defmodule Heft.Contract.TableTest do
  @moduledoc """
  Table life cycle: new/2 and its options, info/1,2, delete/1, all/0,
  whereis/1, rename/2, and what every function does with something that is
  not a live table.
  """
  use Heft.Contract.Case, async: true

  @shared_info [:size, :type, :keypos, :protection, :named_table, :name, :owner, :heir]

  describe "new/2" do
    contract "defaults: protected set, keypos 1, unnamed, owned by the caller, no heir" do
      tab = new(m, :contract_defaults, [])
      assert m.info(tab, :type) == :set
      assert m.info(tab, :protection) == :protected
      assert m.info(tab, :keypos) == 1
      assert m.info(tab, :named_table) == false
      assert m.info(tab, :name) == :contract_defaults
      assert m.info(tab, :owner) == self()
      assert m.info(tab, :heir) == :none
      assert m.info(tab, :size) == 0
    end

    contract "every shared option is reflected by info/2" do
      name = unique_name()
      heir = start_process()
      tab = new(m, name, [:set, :public, :named_table, {:keypos, 3}, {:heir, heir, :data}])
      assert tab == name
      assert m.info(tab, :type) == :set
      assert m.info(tab, :protection) == :public
      assert m.info(tab, :keypos) == 3
      assert m.info(tab, :named_table) == true
      assert m.info(tab, :name) == name
      assert m.info(tab, :heir) == heir
      assert m.info(new(m, [:private]), :protection) == :private
      assert m.info(new(m, [{:heir, :none}]), :heir) == :none
      m.delete(tab)
      stop(heir)
    end

    contract "unnamed tables may share a name; the name does not reach them" do
      a = new(m, :contract_shared_name, [])
      b = new(m, :contract_shared_name, [])
      assert a != b
      m.insert(a, {1, :a})
      assert m.lookup(b, 1) == []
      assert_raise ArgumentError, fn -> m.lookup(:contract_shared_name, 1) end
      assert m.whereis(:contract_shared_name) == :undefined
    end

    contract "a named table is reached by its name; a second one with that name raises" do
      name = unique_name()
      assert new(m, name, [:named_table]) == name
      assert m.insert(name, {1, :a}) == true
      assert m.lookup(name, 1) == [{1, :a}]
      assert_raise ArgumentError, fn -> new(m, name, [:named_table]) end
      # an unnamed table with the same name is fine
      other = new(m, name, [])
      assert m.lookup(other, 1) == []
      m.delete(name)
    end

    contract "a later option overrides an earlier one of the same kind" do
      tab = new(m, [:public, :private, {:keypos, 2}, {:keypos, 3}])
      assert m.info(tab, :protection) == :private
      assert m.info(tab, :keypos) == 3
      tab2 = new(m, [{:heir, self(), :x}, {:heir, :none}])
      assert m.info(tab2, :heir) == :none
    end

    contract ":public and :private: the last one wins; :protected changes nothing" do
      for {opts, expected} <- [
            {[:public, :protected], :public},
            {[:protected, :public], :public},
            {[:private, :public], :public},
            {[:public, :private], :private},
            {[:private, :protected], :private},
            {[:protected, :private], :private}
          ] do
        assert m.info(new(m, opts), :protection) == expected, inspect(opts)
      end
    end

    contract "the heir may be the owner itself" do
      tab = new(m, [{:heir, self(), :me}])
      assert m.info(tab, :heir) == self()
    end

    contract "ill-formed options raise ArgumentError" do
      bad_options = [
        [:bogus],
        [{:keypos, 0}],
        [{:keypos, -1}],
        [{:keypos, 1.0}],
        [{:keypos, :one}],
        [{:heir, :not_a_pid, 1}],
        [{:heir, self(), 1, 2}],
        [{:named_table, true, :extra}],
        [[:set]],
        [:set | :public],
        [{:keypos}]
      ]

      # {:heir, pid} without data is an option from OTP 29 on.
      bad_options =
        if Heft.VM.fact(:heir_without_data),
          do: bad_options,
          else: [[{:heir, self()}] | bad_options]

      for opts <- bad_options do
        assert_raise ArgumentError, fn -> m.new(unique_name(), opts) end
      end
    end

    contract "options that are not a list, or a name that is not an atom, raise" do
      assert_raise ArgumentError, fn -> m.new(unique_name(), :set) end
      assert_raise ArgumentError, fn -> m.new(unique_name(), %{}) end
      assert_raise ArgumentError, fn -> m.new("name", []) end
      assert_raise ArgumentError, fn -> m.new(1, []) end
      assert_raise ArgumentError, fn -> m.new({:name}, []) end
    end

    contract "nil, true and unicode atoms are valid names" do
      for name <- [nil, true, :ünï] do
        tab = m.new(name, [])
        assert m.info(tab, :name) == name
        m.delete(tab)
      end
    end
  end

  describe "info/1,2" do
    contract "info/1 is a keyword list whose shared keys agree with info/2" do
      tab = new_with(m, [{1}, {2}], [:public, {:keypos, 1}])
      info = m.info(tab)
      assert is_list(info)
      assert Enum.all?(info, &match?({k, _} when is_atom(k), &1))

      for key <- @shared_info do
        assert Keyword.fetch!(info, key) == m.info(tab, key), "info key #{key}"
      end

      assert info[:size] == 2
    end

    contract "size follows inserts, replaces and deletes" do
      tab = new(m)
      m.insert(tab, [{1}, {2}, {3}])
      m.insert(tab, {1, :replaced})
      assert m.info(tab, :size) == 3
      m.delete(tab, 2)
      m.take(tab, 3)
      m.delete(tab, :absent)
      assert m.info(tab, :size) == 1
    end

    contract "an unknown item raises" do
      tab = new(m)

      for item <- [:bogus, "size", 1, {:size}] do
        assert_raise ArgumentError, fn -> m.info(tab, item) end
      end
    end

    contract "a deleted table, or an atom naming no table: :undefined" do
      tab = new(m)
      m.delete(tab)
      assert m.info(tab) == :undefined
      assert m.info(tab, :size) == :undefined
      assert m.info(:contract_no_such_table) == :undefined
      assert m.info(:contract_no_such_table, :owner) == :undefined
    end

    contract "something that is not a table identifier raises" do
      for bad <- [123, "tab", {:tab}, [], self(), 1.0] do
        assert_raise ArgumentError, fn -> m.info(bad) end
        assert_raise ArgumentError, fn -> m.info(bad, :size) end
      end
    end
  end

  describe "delete/1 and dead tables" do
    contract "delete/1 returns true; then every function raises and info is :undefined" do
      tab = new_with(m, {1, 1})
      assert m.delete(tab) == true

      for {call, fun} <- all_calls(m, tab) do
        assert outcome(fun) == {:raise, ArgumentError}, "#{call} on a deleted table"
      end

      assert m.info(tab) == :undefined
    end

    contract "a deleted named table frees its name" do
      name = unique_name()
      tab = new(m, name, [:named_table])
      assert m.delete(tab) == true
      assert m.whereis(name) == :undefined
      assert_raise ArgumentError, fn -> m.lookup(name, 1) end
      assert new(m, name, [:named_table]) == name
      assert m.lookup(name, 1) == []
      m.delete(name)
    end

    contract "a table deleted through its name is dead through its identifier" do
      name = unique_name()
      new(m, name, [:named_table])
      tab = m.whereis(name)
      m.delete(name)
      assert_raise ArgumentError, fn -> m.lookup(tab, 1) end
      assert m.info(tab) == :undefined
    end

    contract "non-tables raise ArgumentError in every function" do
      for not_a_table <- [:contract_no_such_table, make_ref(), 123, "tab", {:tab}, self(), []] do
        for {call, fun} <- all_calls(m, not_a_table) do
          assert outcome(fun) == {:raise, ArgumentError},
                 "#{call} on #{inspect(not_a_table)}"
        end
      end
    end

    contract "the other backend's tables are not tables", needs_heft: true do
      other = if m == :ets, do: Heft, else: :ets
      foreign = new(other, [:public])

      for {call, fun} <- all_calls(m, foreign) do
        assert outcome(fun) == {:raise, ArgumentError}, "#{call} on a #{inspect(other)} table"
      end

      assert other.info(foreign, :size) == 0
    end
  end

  describe "all/0" do
    contract "lists live tables (named ones by name), not deleted ones" do
      unnamed = new(m)
      named = new(m, unique_name(), [:named_table])
      all = m.all()
      assert unnamed in all
      assert named in all
      m.delete(unnamed)
      m.delete(named)
      all = m.all()
      refute unnamed in all
      refute named in all
    end

    contract "lists tables owned by other processes" do
      owner = start_process()
      {:ok, tab} = run_in(owner, fn -> new(m) end)
      assert tab in m.all()
      stop(owner)
      refute tab in m.all()
    end
  end

  describe "whereis/1" do
    contract "a named table's identifier works in every function" do
      name = unique_name()
      new(m, name, [:named_table, :public])
      tab = m.whereis(name)
      refute tab == :undefined
      assert m.insert(tab, {1, :via_id}) == true
      assert m.lookup(name, 1) == [{1, :via_id}]
      assert m.info(tab, :name) == name
      m.delete(name)
    end

    contract "unknown names and unnamed tables: :undefined; non-atoms raise" do
      new(m, :contract_unnamed_whereis, [])
      assert m.whereis(:contract_unnamed_whereis) == :undefined
      assert m.whereis(:contract_never_created) == :undefined

      for bad <- ["name", 1, make_ref(), {:a}] do
        assert_raise ArgumentError, fn -> m.whereis(bad) end
      end
    end
  end

  describe "rename/2" do
    contract "renames a named table: new name works, old one is gone" do
      old = unique_name()
      new_name = unique_name()
      new(m, old, [:named_table])
      m.insert(old, {1, :a})
      tab = m.whereis(old)
      assert m.rename(old, new_name) == new_name
      assert m.lookup(new_name, 1) == [{1, :a}]
      assert_raise ArgumentError, fn -> m.lookup(old, 1) end
      assert m.whereis(old) == :undefined
      assert m.whereis(new_name) == tab
      assert m.info(new_name, :name) == new_name
      assert m.lookup(tab, 1) == [{1, :a}]
      m.delete(new_name)
    end

    contract "renaming onto an existing name, or its own name, raises" do
      a = new(m, unique_name(), [:named_table])
      b = new(m, unique_name(), [:named_table])
      assert_raise ArgumentError, fn -> m.rename(a, b) end
      assert_raise ArgumentError, fn -> m.rename(a, a) end
      assert m.info(a, :name) == a
      m.delete(a)
      m.delete(b)
    end

    contract "renaming to a non-atom raises" do
      a = new(m, unique_name(), [:named_table])

      for bad <- ["name", 1, {:a}] do
        assert_raise ArgumentError, fn -> m.rename(a, bad) end
      end

      m.delete(a)
    end

    # Observed on OTP 25: renaming an unnamed table returns the table
    # identifier (not the new name), changes info(:name), and the new name
    # does not reach it.
    contract "renaming an unnamed table changes info(:name) only, returns the table" do
      tab = new(m)
      name = unique_name()
      assert m.rename(tab, name) == tab
      assert m.info(tab, :name) == name
      assert m.whereis(name) == :undefined
      assert_raise ArgumentError, fn -> m.lookup(name, 1) end
    end
  end
end
