defmodule Heft.Contract.OrderedSetTest do
  @moduledoc """
  :ordered_set tables (a later Heft type): the Heft variants run as soon as
  `Heft.new(name, [:ordered_set])` succeeds and the functions used exist.
  Keys compare by == here (1 and 1.0 are one key), and traversal follows
  term order, so results are compared without sorting.
  """
  use Heft.Contract.Case, async: true

  @req [type: :ordered_set]

  contract "info type; traversal, tab2list and foldl follow term order", @req do
    tab = new(m, [:ordered_set])
    assert m.info(tab, :type) == :ordered_set
    keys = [3, -1, :atom, "bin", {1}, [1], 2.5, 10 ** 30, %{}, self()]
    m.insert(tab, for(k <- Enum.shuffle(keys), do: {k, :v}))
    assert traversal(m, tab) == Enum.sort(keys)
    assert Enum.map(m.tab2list(tab), &elem(&1, 0)) == Enum.sort(keys)
    assert m.foldl(fn {k, _}, acc -> [k | acc] end, [], tab) == Enum.sort(keys, :desc)
  end

  contract "keys compare by ==: 1 and 1.0 are one key, the last insert wins", @req do
    tab = new(m, [:ordered_set])
    m.insert(tab, {1, :int})
    m.insert(tab, {1.0, :float})
    assert m.info(tab, :size) == 1
    assert m.lookup(tab, 1) == [{1.0, :float}]
    assert m.member(tab, 1.0)
    assert m.insert_new(tab, {1, :again}) == false
    assert m.take(tab, 1) == [{1.0, :float}]
  end

  contract "next/2 of a key that is not in the table returns the next greater key", @req do
    tab = new_with(m, [{10}, {20}, {30}], [:ordered_set])
    assert m.next(tab, 15) == 20
    assert m.next(tab, 0) == 10
    assert m.next(tab, 30) == :"$end_of_table"
    assert m.next(tab, :atom) == :"$end_of_table"
    assert m.next(tab, 20.0) == 30
  end

  contract "last/1 and prev/2 walk backwards", type: :ordered_set, functions: [last: 1, prev: 2] do
    tab = new(m, [:ordered_set])
    assert m.last(tab) == :"$end_of_table"
    m.insert(tab, for(i <- 1..100, do: {i}))
    assert m.last(tab) == 100

    walk =
      Stream.unfold(m.last(tab), fn
        :"$end_of_table" -> nil
        k -> {k, m.prev(tab, k)}
      end)

    assert Enum.to_list(walk) == Enum.to_list(100..1//-1)
    assert m.prev(tab, 50.5) == 50
    assert m.prev(tab, 0) == :"$end_of_table"
  end

  contract "foldr/3 folds from the greatest key", type: :ordered_set, functions: [foldr: 3] do
    tab = new_with(m, for(i <- 1..10, do: {i}), [:ordered_set])
    assert m.foldr(fn {k}, acc -> [k | acc] end, [], tab) == Enum.to_list(1..10)
  end

  contract "update_counter with a key given as a float finds the integer key", @req do
    tab = new_with(m, {1, 0}, [:ordered_set])
    assert m.update_counter(tab, 1.0, 5) == 5
    assert m.lookup(tab, 1) == [{1, 5}]
  end
end
