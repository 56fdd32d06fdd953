defmodule Heft.Contract.BagTest do
  @moduledoc """
  :bag and :duplicate_bag tables (later Heft types): the Heft variants run as
  soon as `Heft.new(name, [type])` succeeds. Lookups return the objects of a
  key in insertion order (documented for both types), so they are compared
  as they are; whole-table results are compared sorted.
  """
  use Heft.Contract.Case, async: true

  for type <- [:bag, :duplicate_bag] do
    contract "#{type}: several objects per key, in insertion order", type: type do
      tab = new(m, [unquote(type)])
      assert m.info(tab, :type) == unquote(type)
      for obj <- [{:k, 3}, {:k, 1}, {:k, 2}, {:other, 0}], do: m.insert(tab, obj)
      assert m.lookup(tab, :k) == [{:k, 3}, {:k, 1}, {:k, 2}]
      assert m.info(tab, :size) == 4
      assert m.lookup_element(tab, :k, 2) == [3, 1, 2]
      assert m.member(tab, :k)
    end

    contract "#{type}: take returns all objects of the key and removes them", type: type do
      tab = new(m, [unquote(type)])
      for obj <- [{:k, 1}, {:k, 2}, {:j, 3}], do: m.insert(tab, obj)
      assert m.take(tab, :k) == [{:k, 1}, {:k, 2}]
      assert contents(m, tab) == [{:j, 3}]
    end

    contract "#{type}: delete/2 removes every object of the key", type: type do
      tab = new_with(m, [{:k, 1}, {:k, 2}, {:j, 3}], [unquote(type)])
      assert m.delete(tab, :k) == true
      assert contents(m, tab) == [{:j, 3}]
    end

    contract "#{type}: insert_new is false if the key has any object", type: type do
      tab = new_with(m, {:k, 1}, [unquote(type)])
      assert m.insert_new(tab, {:k, 2}) == false
      assert m.insert_new(tab, [{:new, 1}, {:k, 3}]) == false
      assert m.insert_new(tab, [{:new, 1}, {:new, 2}]) == true
      assert Enum.sort(m.lookup(tab, :new)) == [{:new, 1}, {:new, 2}]
    end

    contract "#{type}: update_counter and update_element raise", type: type do
      tab = new_with(m, {:k, 1}, [unquote(type)])
      assert_raise ArgumentError, fn -> m.update_counter(tab, :k, 1) end
      assert_raise ArgumentError, fn -> m.update_counter(tab, :new, 1, {:new, 0}) end
      assert_raise ArgumentError, fn -> m.update_element(tab, :k, {2, 5}) end
      assert contents(m, tab) == [{:k, 1}]
    end

    contract "#{type}: 1 and 1.0 are distinct keys", type: type do
      tab = new_with(m, [{1, :int}, {1.0, :float}], [unquote(type)])
      assert m.lookup(tab, 1) == [{1, :int}]
      assert m.lookup(tab, 1.0) == [{1.0, :float}]
    end

    contract "#{type}: traversal visits each key once however many objects it has", type: type do
      tab = new(m, [unquote(type)])
      m.insert(tab, for(k <- 1..100, v <- 1..3, do: {k, v}))
      assert Enum.sort(traversal(m, tab)) == Enum.to_list(1..100)
      assert length(m.tab2list(tab)) == m.info(tab, :size)
    end
  end

  # A :bag stores the objects of one key inserted by ONE list in reverse
  # list order up to OTP 26, in list order from OTP 27 (Heft.VM); a
  # :duplicate_bag keeps list order on every release; objects inserted by
  # separate calls keep insertion order in both.
  contract "bag: one list insert stores same-key objects in the VM's order", type: :bag do
    tab = new(m, [:bag])
    m.insert(tab, [{:k, 3}, {:k, 1}, {:j, 0}, {:k, 2}])

    if Heft.VM.fact(:bag_batch_reversed) do
      assert m.lookup(tab, :k) == [{:k, 2}, {:k, 1}, {:k, 3}]
      m.insert(tab, [{:k, 5}, {:k, 4}])
      assert m.lookup(tab, :k) == [{:k, 2}, {:k, 1}, {:k, 3}, {:k, 4}, {:k, 5}]
    else
      assert m.lookup(tab, :k) == [{:k, 3}, {:k, 1}, {:k, 2}]
      m.insert(tab, [{:k, 5}, {:k, 4}])
      assert m.lookup(tab, :k) == [{:k, 3}, {:k, 1}, {:k, 2}, {:k, 5}, {:k, 4}]
    end
  end

  contract "duplicate_bag: one list insert keeps list order", type: :duplicate_bag do
    tab = new(m, [:duplicate_bag])
    m.insert(tab, [{:k, 3}, {:k, 1}, {:j, 0}, {:k, 2}])
    assert m.lookup(tab, :k) == [{:k, 3}, {:k, 1}, {:k, 2}]
  end

  contract "bag: an identical object is stored once, re-inserting keeps its place", type: :bag do
    tab = new(m, [:bag])
    m.insert(tab, [{:k, 1}, {:k, 2}, {:k, 1}])
    assert m.lookup(tab, :k) == [{:k, 1}, {:k, 2}]
    assert m.info(tab, :size) == 2
    m.insert(tab, {:k, 1})
    assert m.lookup(tab, :k) == [{:k, 1}, {:k, 2}]
  end

  contract "bag: delete_object removes exactly that object", type: :bag do
    tab = new_with(m, [{:k, 1}, {:k, 2}], [:bag])
    assert m.delete_object(tab, {:k, 1}) == true
    assert m.lookup(tab, :k) == [{:k, 2}]
    assert m.delete_object(tab, {:k, 2.0}) == true
    assert m.lookup(tab, :k) == [{:k, 2}]
  end

  contract "duplicate_bag: identical objects are all kept", type: :duplicate_bag do
    tab = new(m, [:duplicate_bag])
    m.insert(tab, [{:k, 1}, {:k, 2}, {:k, 1}])
    assert m.lookup(tab, :k) == [{:k, 1}, {:k, 2}, {:k, 1}]
    assert m.info(tab, :size) == 3
  end

  contract "duplicate_bag: delete_object removes every identical instance", type: :duplicate_bag do
    tab = new_with(m, [{:k, 1}, {:k, 2}, {:k, 1}], [:duplicate_bag])
    assert m.delete_object(tab, {:k, 1}) == true
    assert m.lookup(tab, :k) == [{:k, 2}]
  end
end
