defmodule Heft.RefusedCallsTest do
  # A call Heft refuses changes nothing, and what it accepts it handles
  # everywhere after: no write that raises half done, no object that one
  # function stores and another cannot touch, no table left by a failed
  # load; and select continuations belong to the table they walk.
  use ExUnit.Case, async: true

  @moduletag :tmp_dir

  # A map nested `n` deep: %{a: %{a: ... :x}}.
  defp deep_map(n), do: Enum.reduce(1..n, :x, fn _, acc -> %{a: acc} end)

  test "insert/3 and insert_new/3 with sync: :commit on a table without :persist raise and insert nothing" do
    t = Heft.new(:no_persist, [])

    assert_raise ArgumentError, ~r/persistent/, fn -> Heft.insert(t, {1, :a}, sync: :commit) end

    assert_raise ArgumentError, ~r/persistent/, fn ->
      Heft.insert_new(t, [{2, :b}, {3, :c}], sync: :commit)
    end

    assert_raise ArgumentError, fn -> Heft.insert(t, {4, :d}, sync: :bogus) end
    assert_raise ArgumentError, fn -> Heft.insert(t, {5, :e}, [:x]) end
    assert Heft.tab2list(t) == []
  end

  test "values with maps nested deeper than a key may are stored and handled by every function" do
    deep = deep_map(100)

    for type <- [:set, :ordered_set] do
      t = Heft.new(:deep_values, [type, :public])
      objects = for i <- 1..6, do: {i, deep, i}
      assert Heft.insert(t, objects) == true
      assert Heft.lookup(t, 1) == [{1, deep, 1}]

      # delete_object finds the object exactly (and not a different one).
      assert Heft.delete_object(t, {1, deep_map(99), 1}) == true
      assert Heft.member(t, 1)
      assert Heft.delete_object(t, {1, deep, 1}) == true
      refute Heft.member(t, 1)

      # select_replace, then select_delete after other matches, then
      # match_delete.
      assert Heft.select_replace(t, [{{:"$1", :"$2", 2}, [], [{{:"$1", :"$2", :two}}]}]) == 1
      assert Heft.lookup(t, 2) == [{2, deep, :two}]
      assert Heft.select_delete(t, [{{:"$1", :_, :_}, [{:<, :"$1", 5}], [true]}]) == 3
      assert Heft.match_delete(t, {:_, deep, :_}) == true
      assert Heft.tab2list(t) == []
      Heft.delete(t)
    end
  end

  test "a bag refuses an object with maps nested too deep, and the whole insert changes nothing" do
    for type <- [:bag, :duplicate_bag] do
      t = Heft.new(:deep_bag, [type])
      Heft.insert(t, {0, :kept})

      e =
        assert_raise ArgumentError, fn ->
          Heft.insert(t, [{1, :fine}, {2, deep_map(100)}, {3, :fine}])
        end

      assert e.message =~ "64"
      assert_raise ArgumentError, fn -> Heft.insert_new(t, {4, deep_map(100)}) end
      assert Heft.tab2list(t) == [{0, :kept}]
    end
  end

  test "a key Heft cannot store is in no table: reads and deletes answer as ETS does for a missing key" do
    key = deep_map(100)

    for type <- [:set, :ordered_set, :bag, :duplicate_bag] do
      h = Heft.new(:deep_key, [type, :public])
      e = :ets.new(:deep_key, [type, :public])
      for t <- [h, e], m = if(t == h, do: Heft, else: :ets), do: m.insert(t, {1, :a})

      calls = [
        &[&1.lookup(&2, key)],
        &[&1.member(&2, key)],
        &[&1.take(&2, key)],
        &[&1.delete(&2, key)],
        &[&1.delete_object(&2, {key, :a})],
        &[&1.delete_object(&2, {1, key})]
      ]

      calls =
        if type in [:set, :ordered_set],
          do: [(&[&1.update_element(&2, key, {2, :b})]) | calls],
          else: calls

      for call <- calls do
        assert call.(Heft, h) == call.(:ets, e), inspect({type, call.(:ets, e)})
      end

      assert_raise ArgumentError, fn -> Heft.lookup_element(h, key, 2) end
      assert Heft.tab2list(h) == :ets.tab2list(e)
    end
  end

  # A file of the tab-file format (docs/tab-file.md) holding `objects`,
  # which Heft could not have written itself.
  defp tab_file(path, meta, objects) do
    frame = fn tag, seq, count, payload ->
      head = <<tag, seq::little-32, count::little-32, byte_size(payload)::little-32>>
      [head, <<:erlang.crc32(head)::little-32>>, payload, <<:erlang.crc32(payload)::little-32>>]
    end

    File.write!(path, [
      "HEFT-TAB",
      <<1::little-16>>,
      frame.(0, 0, 0, :erlang.term_to_binary(meta)),
      frame.(1, 1, 2, :erlang.term_to_binary(Enum.take(objects, 2))),
      frame.(1, 2, length(objects) - 2, :erlang.term_to_binary(Enum.drop(objects, 2))),
      frame.(0xFF, 3, 0, <<length(objects)::little-64>>)
    ])
  end

  # The tables this process owns (other tests' come and go meanwhile).
  defp owned, do: Enum.filter(Heft.all(), &(Heft.info(&1, :owner) == self()))

  test "file2tab of a file whose objects Heft cannot store returns an error and leaves no table",
       %{tmp_dir: dir} do
    for {type, named, bad} <- [
          {:set, true, {deep_map(100), :v}},
          {:ordered_set, false, {deep_map(100), :v}},
          {:bag, true, {:k, deep_map(100)}}
        ] do
      name = :"unstorable_#{type}"
      path = Path.join(dir, "#{name}.tab")

      meta = %{
        name: name,
        named_table: named,
        type: type,
        keypos: 1,
        protection: :protected,
        compression: :none
      }

      tab_file(path, meta, [{1, :a}, {2, :b}, {3, :c}, bad])
      before = owned()
      assert {:error, {:unsupported_object, offset}} = Heft.file2tab(path)
      assert offset > 0
      assert Heft.whereis(name) == :undefined
      assert owned() == before
      # The name is free.
      assert Heft.new(name, [:named_table]) == name
      Heft.delete(name)
    end
  end

  defp walks(t, spec) do
    [
      {:select, Heft.select(t, spec, 1), &Heft.select/1},
      {:select_reverse, Heft.select_reverse(t, spec, 1), &Heft.select_reverse/1},
      {:match, Heft.match(t, :"$1", 1), &Heft.match/1},
      {:match_object, Heft.match_object(t, :_, 1), &Heft.match_object/1}
    ]
  end

  test "a continuation raises once its table is deleted, even re-created under its name with rows buffered" do
    spec = [{:_, [], [:"$_"]}]

    for type <- [:set, :ordered_set, :bag], by_name <- [true, false] do
      name = :"cont_#{type}"
      Heft.new(name, [type, :named_table, :public])
      # In a bag, one key's objects: a chunk of one keeps the other nine
      # for the next call, as ETS does (an ordered_set keeps none).
      Heft.insert(name, for(i <- 1..10, do: if(type == :bag, do: {:k, i}, else: {i})))
      tab = if by_name, do: name, else: Heft.whereis(name)
      conts = walks(tab, spec)

      if type == :bag,
        do: for({_, {[_], cont}, _} <- conts, do: assert(elem(cont, 6) != []))

      Heft.delete(name)
      Heft.new(name, [type, :named_table, :public])
      Heft.insert(name, for(i <- 1..10, do: {i * 100}))

      for {fun, {_, cont}, next} <- conts do
        outcome =
          try do
            next.(cont)
          rescue
            ArgumentError -> :badarg
          end

        assert outcome == :badarg, inspect({type, by_name, fun, outcome})
      end

      Heft.delete(name)
    end
  end

  test "a continuation keeps working after its table is renamed" do
    t = Heft.new(:cont_renamed, [:named_table, :ordered_set])
    Heft.insert(t, for(i <- 1..5, do: {i}))
    {[{1}], cont} = Heft.select(t, [{:_, [], [:"$_"]}], 1)
    Heft.rename(t, :cont_renamed_now)
    assert {[{2}], _} = Heft.select(cont)
  end

  test "foldl/3 and foldr/3 with a fun of another arity: the accumulator on an empty table, ArgumentError once there is an object" do
    t = Heft.new(:fold_arity, [:ordered_set])

    for fold <- [&Heft.foldl/3, &Heft.foldr/3], fun <- [fn x -> x end, fn x, _, _ -> x end] do
      assert fold.(fun, :acc, t) == :acc
    end

    e = :ets.new(:fold_arity, [:ordered_set])
    assert :ets.foldl(fn x -> x end, :acc, e) == :acc
    assert :ets.foldr(fn x -> x end, :acc, e) == :acc

    Heft.insert(t, {1})

    for fold <- [&Heft.foldl/3, &Heft.foldr/3] do
      assert_raise ArgumentError, ~r/two arguments/, fn -> fold.(fn x -> x end, :acc, t) end
      assert_raise ArgumentError, ~r/two arguments/, fn -> fold.(:notafun, :acc, t) end
      assert fold.(fn {k}, acc -> [k | acc] end, [], t) == [1]
    end
  end
end
