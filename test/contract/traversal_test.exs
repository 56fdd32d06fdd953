defmodule Heft.Contract.TraversalTest do
  @moduledoc """
  first/1, next/2, foldl/3, tab2list/1 on a :set table. Set order is
  unspecified in both backends, so results are compared as sorted lists.
  next/2 on a key that is not in the table is a deliberate difference
  (differences_test.exs).
  """
  use Heft.Contract.Case, async: true
  alias Heft.Contract.Gen

  contract "empty table: first is :\"$end_of_table\", tab2list [], foldl returns the accumulator" do
    tab = new(m)
    assert m.first(tab) == :"$end_of_table"
    assert m.tab2list(tab) == []
    assert m.foldl(fn _, _ -> flunk("called on an empty table") end, :acc, tab) == :acc
  end

  contract "one record: first is its key, next of it is the end" do
    tab = new_with(m, {:only, 1})
    assert m.first(tab) == :only
    assert m.next(tab, :only) == :"$end_of_table"
  end

  contract "first/next visits every key exactly once (10_000 mixed keys)" do
    tab = new(m)
    keys = Enum.uniq_by(Enum.flat_map(1..2_000, &[&1, &1 * 1.0, "#{&1}", {&1}, [&1]]), &exact/1)
    m.insert(tab, for(k <- keys, do: {k, :v}))
    visited = traversal(m, tab)
    assert length(visited) == length(keys)
    assert Enum.map(canonical_sort(visited), &exact/1) == Enum.map(canonical_sort(keys), &exact/1)
  end

  contract "first/next, tab2list and foldl agree on the contents" do
    tab = new(m, [{:keypos, 2}])
    objects = for i <- 1..500, do: {i * 2, i, Integer.to_string(i)}
    m.insert(tab, objects)
    assert contents(m, tab) == objects
    assert canonical_sort(m.foldl(&[&1 | &2], [], tab)) == objects
    assert canonical_sort(traversal(m, tab)) == Enum.to_list(1..500)
    assert m.foldl(fn {_, k, _}, acc -> acc + k end, 0, tab) == div(500 * 501, 2)
  end

  contract "traversal after deletes and re-inserts still sees each live key once" do
    tab = new_with(m, for(i <- 1..1_000, do: {i}))
    for i <- 1..1_000, rem(i, 2) == 0, do: m.delete(tab, i)
    for i <- 2_001..2_100, do: m.insert(tab, {i})
    expected = Enum.to_list(1..1_000//2) ++ Enum.to_list(2_001..2_100)
    assert Enum.sort(traversal(m, tab)) == expected
  end

  contract "next of the last key is :\"$end_of_table\"" do
    tab = new_with(m, [{1}, {2}, {3}])
    last = List.last(traversal(m, tab))
    assert m.next(tab, last) == :"$end_of_table"
  end

  # first/next cannot tell a key :"$end_of_table" from the end; tab2list/1
  # still returns the record. (What foldl/3 does with it differs on purpose:
  # see differences_test.exs, 9.)
  contract ":\"$end_of_table\" is a legal key, but first/next stop at it" do
    tab = new_with(m, {:"$end_of_table", :stored})
    assert m.lookup(tab, :"$end_of_table") == [{:"$end_of_table", :stored}]
    assert m.first(tab) == :"$end_of_table"
    assert m.tab2list(tab) == [{:"$end_of_table", :stored}]
  end

  for type <- [:set, :ordered_set, :bag, :duplicate_bag] do
    contract "#{type}: next/2 and prev/2 of :\"$end_of_table\" raise, unless a set or bag holds it" do
      tab = new_with(m, [{1}, {:a}], [unquote(type)])
      assert_raise ArgumentError, fn -> m.next(tab, :"$end_of_table") end
      assert_raise ArgumentError, fn -> m.prev(tab, :"$end_of_table") end
      m.insert(tab, {:"$end_of_table"})

      if unquote(type) == :ordered_set do
        assert_raise ArgumentError, fn -> m.next(tab, :"$end_of_table") end
        assert_raise ArgumentError, fn -> m.prev(tab, :"$end_of_table") end
      else
        assert m.next(tab, :"$end_of_table") in [1, :a, :"$end_of_table"]
        assert m.prev(tab, :"$end_of_table") == m.next(tab, :"$end_of_table")
      end
    end
  end

  for type <- [:set, :ordered_set, :bag, :duplicate_bag] do
    contract "#{type}: first_lookup/next_lookup and last_lookup/prev_lookup walk keys with their objects",
      functions: [first_lookup: 1, next_lookup: 2, last_lookup: 1, prev_lookup: 2] do
      objects = for i <- 1..50, j <- 1..2, do: {i, j}
      tab = new_with(m, objects, [unquote(type)])

      for {first, step} <- [
            {&m.first_lookup/1, &m.next_lookup/2},
            {&m.last_lookup/1, &m.prev_lookup/2}
          ] do
        walk =
          Stream.unfold(first.(tab), fn
            :"$end_of_table" -> nil
            {key, _objs} = item -> {item, step.(tab, key)}
          end)
          |> Enum.to_list()

        assert length(walk) == 50

        assert Enum.all?(walk, fn {key, objs} ->
                 Enum.sort(objs) == Enum.sort(m.lookup(tab, key))
               end)

        assert Enum.sort(Enum.flat_map(walk, &elem(&1, 1))) == Enum.sort(m.tab2list(tab))
      end

      assert m.first_lookup(new(m, [unquote(type)])) == :"$end_of_table"
    end
  end

  contract "first_lookup/1 of a table whose only key is :\"$end_of_table\"",
    functions: [first_lookup: 1, next_lookup: 2] do
    tab = new_with(m, {:"$end_of_table", :x})
    assert m.first_lookup(tab) == {:"$end_of_table", [{:"$end_of_table", :x}]}
    assert m.next_lookup(tab, :"$end_of_table") == :"$end_of_table"
  end

  contract "foldl: an exception raised by the fun propagates" do
    tab = new_with(m, [{1}, {2}])
    assert_raise RuntimeError, "boom", fn -> m.foldl(fn _, _ -> raise "boom" end, 0, tab) end

    assert catch_throw(m.foldl(fn {k}, _ -> throw({:found, k}) end, 0, tab)) in [
             {:found, 1},
             {:found, 2}
           ]

    assert m.info(tab, :size) == 2
  end

  contract "foldl: deleting each visited record during the fold visits all, once" do
    tab = new_with(m, for(i <- 1..1_000, do: {i, i}))

    visited =
      m.foldl(
        fn {k, _} = obj, acc ->
          true = m.delete_object(tab, obj)
          [k | acc]
        end,
        [],
        tab
      )

    assert Enum.sort(visited) == Enum.to_list(1..1_000)
    assert m.tab2list(tab) == []
  end

  contract "foldl: reading the table inside the fun works" do
    tab = new_with(m, for(i <- 1..100, do: {i, i * i}))
    assert m.foldl(fn {k, _}, acc -> acc + m.lookup_element(tab, k, 2) end, 0, tab) == 338_350
  end

  contract "tab2list of every kind of term" do
    tab = new(m)
    objects = for t <- Gen.interesting_terms(), do: {t, t}
    m.insert(tab, objects)
    assert Enum.map(contents(m, tab), &exact/1) == Enum.map(canonical_sort(objects), &exact/1)
  end
end
