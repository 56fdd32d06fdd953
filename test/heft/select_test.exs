defmodule Heft.SelectTest do
  # The select family against :ets side by side: the same objects in an ETS
  # table and a Heft table, the same call to both (`:ets` and `Heft` share
  # function names), results compared with order normalised (a set has
  # none). Then what only Heft has to prove: bound keys are looked up, not
  # scanned; deletes and replaces never undo a concurrent writer.
  use ExUnit.Case, async: true

  alias Heft.Select

  # Select.stats/0 counts what each call fetches.
  setup do
    Select.counting()
  end

  @objects for i <- 1..2_000,
               do: {i, rem(i, 7), if(rem(i, 3) == 0, do: "s#{i}", else: :"a#{rem(i, 5)}")}

  # An ETS table and a Heft table holding `objects`.
  defp pair(objects \\ @objects, opts \\ []) do
    e = :ets.new(:select_test, [:public | opts])
    h = Heft.new(:select_test, [:public | opts])
    :ets.insert(e, objects)
    Heft.insert(h, objects)
    {e, h}
  end

  defp norm(list) when is_list(list), do: Enum.sort(list)
  defp norm(other), do: other

  # Runs `fun.(module, table)` on both and asserts equal (sorted) results.
  defp same({e, h}, fun) do
    expected = norm(fun.(:ets, e))
    assert norm(fun.(Heft, h)) == expected
    expected
  end

  defp contents({e, h}) do
    assert Enum.sort(Heft.tab2list(h)) == Enum.sort(:ets.tab2list(e))
  end

  test "which atoms are match variables: :\"$N\" with N a number without leading zeros, as ETS" do
    objs = [{:a, 1}, {:"$01", 2}, {:"$1x", 3}, {:"$", 4}]
    p = pair(objs)

    for atom <- [:"$0", :"$1", :"$12", :"$01", :"$1x", :"$", :"$_a"] do
      same(p, fn m, t -> m.match(t, {atom, :_}) end)
      same(p, fn m, t -> m.select(t, [{{atom, :"$9"}, [], [:"$$"]}]) end)
    end
  end

  # An Erlang fun2ms call, evaluated as the shell does (ms_transform), with
  # `bindings` for variables imported into the fun.
  defp fun2ms(source, bindings \\ []) do
    {:ok, tokens, _} = :erl_scan.string(String.to_charlist("ets:fun2ms(#{source})."))
    {:ok, exprs} = :erl_parse.parse_exprs(tokens)
    {:value, spec, _} = :erl_eval.exprs(exprs, :erl_eval.new_bindings() |> bind(bindings))
    spec
  end

  defp bind(b, bindings),
    do: Enum.reduce(bindings, b, fn {k, v}, b -> :erl_eval.add_binding(k, v, b) end)

  # Every result of a select/3-style walk, checking each batch's size.
  defp drain(:"$end_of_table", _limit, next_fun), do: {[], next_fun}

  defp drain({results, cont}, limit, next_fun) do
    assert length(results) <= limit
    assert results != []
    {rest, _} = drain(next_fun.(cont), limit, next_fun)
    {results ++ rest, next_fun}
  end

  defp walk(first, limit, next_fun), do: first |> drain(limit, next_fun) |> elem(0)

  @specs [
    [{:_, [], [:"$_"]}],
    [{{:"$1", :"$2", :_}, [{:==, :"$2", 3}], [:"$1"]}],
    [{{:"$1", :_, :"$3"}, [{:is_binary, :"$3"}], [{{:"$3", :"$1"}}]}],
    [{{:"$1", 2, :_}, [], [:"$$"]}, {{:"$1", 4, :_}, [], [:"$1"]}],
    [{{:"$1", :_, :a3}, [{:andalso, {:>, :"$1", 100}, {:<, :"$1", 200}}], [true]}],
    [{{:"$1", :_, :_}, [{:"=:=", {:rem, :"$1", 2}, 0}], [{:+, :"$1", 1}]}],
    [{{:_, :_}, [], [:"$_"]}],
    [{:"$1", [{:is_tuple, :"$1"}], [{:element, 1, :"$1"}]}],
    [{{:"$1", :_, :_}, [], [{:+, :"$1", :a}]}]
  ]

  describe "select/2 against ETS" do
    test "hand-written specs" do
      t = pair()

      for spec <- @specs do
        same(t, fn m, tab -> m.select(tab, spec) end)
      end
    end

    test "specs from ets:fun2ms/1 work unchanged" do
      t = pair()

      specs = [
        fun2ms("fun({K, V, _}) when K > 1990 -> {V, K} end"),
        fun2ms("fun(X = {K, _, S}) when is_binary(S), K < 30 -> X end"),
        fun2ms("fun({K, 3, _}) when K rem 100 =:= 0 -> K end"),
        fun2ms("fun({K, V, _}) when K =:= Wanted -> V end", Wanted: 77),
        fun2ms("fun({K, _, A}) when A == a1; A == a2 -> K end")
      ]

      for spec <- specs do
        assert same(t, fn m, tab -> m.select(tab, spec) end) != []
      end
    end

    test "a table with keypos 2" do
      objects = for i <- 1..500, do: {:rec, i, rem(i, 10)}
      t = pair(objects, keypos: 2)
      same(t, fn m, tab -> m.select(tab, [{{:rec, 17, :"$1"}, [], [:"$1"]}]) end)
      same(t, fn m, tab -> m.select(tab, [{{:_, :"$1", 3}, [], [:"$1"]}]) end)
      assert Select.plan(elem(t, 1).ref, [{{:rec, 17, :"$1"}, [], [:"$1"]}]) == {:lookup, [17]}
    end

    test "the empty spec matches nothing; an invalid spec raises as ETS's badarg" do
      t = pair()
      same(t, fn m, tab -> m.select(tab, []) end)
      same(t, fn m, tab -> m.select(tab, [], 5) end)
      same(t, fn m, tab -> m.select_count(tab, []) end)

      for bad <- [
            :not_a_list,
            [:not_a_clause],
            [{:_, [], []}],
            [{{:"$1", :_}, [], [:"$2"]}],
            [{:_, [{:no_such_guard, 1}], [true]}],
            [{:_, [], [true]} | :improper]
          ] do
        assert_raise ArgumentError, fn -> :ets.select(elem(t, 0), bad) end

        assert_raise ArgumentError, ~r/match specification/, fn ->
          Heft.select(elem(t, 1), bad)
        end

        assert_raise ArgumentError, fn -> Heft.select_count(elem(t, 1), bad) end
        assert_raise ArgumentError, fn -> Heft.select_delete(elem(t, 1), bad) end
        assert_raise ArgumentError, fn -> Heft.select(elem(t, 1), bad, 10) end
      end

      contents(t)
    end

    test "an error in a body gives :EXIT, in a guard a failed clause, as in ETS" do
      t = pair()
      spec = [{{:"$1", :_, :_}, [], [{{:"$1", {:+, :"$1", :a}}}]}]
      assert {1, :EXIT} in same(t, fn m, tab -> m.select(tab, spec) end)
      spec = [{{:"$1", :_, :_}, [{:>, {:+, :"$1", :a}, 0}], [:"$1"]}]
      assert same(t, fn m, tab -> m.select(tab, spec) end) == []
    end
  end

  describe "continuations" do
    test "select/3 and select/1 give every result once, at most limit at a time" do
      t = {e, h} = pair()

      for spec <- @specs, limit <- [1, 3, 7, 256, 5_000] do
        expected = Enum.sort(:ets.select(e, spec))
        got = walk(Heft.select(h, spec, limit), limit, &Heft.select/1)
        assert Enum.sort(got) == expected, "#{inspect(spec)} limit #{limit}"

        ets_got = walk(:ets.select(e, spec, limit), limit, &:ets.select/1)
        assert Enum.sort(ets_got) == expected
      end

      contents(t)
    end

    test "batches are exactly limit long until the last, which ends the walk" do
      {_e, h} = pair()
      {first, cont} = Heft.select(h, [{:_, [], [:"$_"]}], 300)
      assert length(first) == 300

      sizes =
        Stream.unfold(cont, fn
          :"$end_of_table" -> nil
          c -> with {r, c} <- Heft.select(c), do: {length(r), c}
        end)

      assert Enum.to_list(sizes) == [300, 300, 300, 300, 300, 200]
      assert Heft.select(:"$end_of_table") == :"$end_of_table"
      assert :ets.select(:"$end_of_table") == :"$end_of_table"
    end

    test "the last results come with :\"$end_of_table\" as in ETS" do
      t = pair()
      spec = [{{:"$1", :_, :_}, [{:<, :"$1", 4}], [:"$1"]}]
      {got, cont} = Heft.select(elem(t, 1), spec, 100)
      assert {Enum.sort(got), cont} == {[1, 2, 3], :"$end_of_table"}
      same(t, fn m, tab -> m.select(tab, [{{:"$1", :_, :_}, [{:<, :"$1", 0}], [:"$1"]}], 10) end)
    end

    test "a bound-key select/3 continues over its keys" do
      t = pair()
      spec = for k <- 1..20, do: {{k, :_, :_}, [], [:"$_"]}
      expected = Enum.sort(:ets.select(elem(t, 0), spec))
      assert Enum.sort(walk(Heft.select(elem(t, 1), spec, 3), 3, &Heft.select/1)) == expected
    end

    test "the limit must be a positive integer" do
      {e, h} = pair()

      for bad <- [0, -1, 1.5, :x] do
        assert_raise ArgumentError, fn -> :ets.select(e, [{:_, [], [true]}], bad) end
        assert_raise ArgumentError, ~r/limit/, fn -> Heft.select(h, [{:_, [], [true]}], bad) end
      end
    end

    test "a continuation of a deleted table raises; a foreign term raises" do
      {_e, h} = pair()
      {_, cont} = Heft.select(h, [{:_, [], [:"$_"]}], 10)
      Heft.delete(h)
      assert_raise ArgumentError, fn -> Heft.select(cont) end
      assert_raise ArgumentError, ~r/continuation/, fn -> Heft.select({:nope}) end
    end

    test "a continuation whose compiled spec was lost is compiled again" do
      {_e, h} = pair()
      {_, cont} = Heft.select(h, [{{:"$1", :_, :_}, [], [:"$1"]}], 10)
      # A compiled spec read back on another node is no longer compiled.
      cont = put_elem(cont, 3, make_ref())
      {next, _} = Heft.select(cont)
      assert length(next) == 10
    end
  end

  describe "select_reverse, select_count, match, match_object" do
    test "select_reverse on a set is select, as in ETS" do
      t = pair()

      for spec <- @specs do
        same(t, fn m, tab -> m.select_reverse(tab, spec) end)
        expected = Enum.sort(:ets.select_reverse(elem(t, 0), spec))
        got = walk(Heft.select_reverse(elem(t, 1), spec, 9), 9, &Heft.select_reverse/1)
        assert Enum.sort(got) == expected
      end
    end

    test "select_count counts exactly the true results" do
      t = pair()

      for spec <- [
            [{:_, [], [true]}],
            [{:"$1", [], [true]}],
            [{{:_, 3, :_}, [], [true]}],
            [{{:_, 3, :_}, [], [:yes]}],
            [{{:"$1", :_, :_}, [{:>, :"$1", 1500}], [true]}, {:_, [], [false]}],
            [{{:_, :_, :"$1"}, [], [{:is_atom, :"$1"}]}],
            [{{:"$1", :_, :_}, [], [{:+, :"$1", :a}]}]
          ] do
        same(t, fn m, tab -> m.select_count(tab, spec) end)
      end
    end

    test "a trivial select_count is the size; others decode only the objects their heads may match" do
      {_e, h} = pair()
      assert Heft.select_count(h, [{:_, [], [true]}]) == 2_000
      assert Select.stats().objects == 0
      # The sieve drops, undecoded, the objects whose second element is not
      # 3, and counts the others undecoded too: it states this spec whole.
      assert Heft.select_count(h, [{{:_, 3, :_}, [], [true]}]) == 286
      assert Select.stats().objects == 0
      # With a body other than `true` it only drops: the VM runs the spec
      # on what it keeps.
      assert Heft.select(h, [{{:_, 3, :_}, [], [:"$_"]}]) |> length() == 286
      assert Select.stats().objects == 286
      # A guard it does not understand (an `orelse`) decodes the whole table.
      spec = [{{:_, :"$1", :_}, [{:orelse, {:==, :"$1", 3}, {:==, :"$1", 3}}], [true]}]
      assert Heft.select_count(h, spec) == 286
      assert Select.stats().objects == 2_000
    end

    test "match/2, match_object/2 and their continuations" do
      t = pair()

      for pattern <- [
            {:"$1", 3, :_},
            {:"$2", :"$1", :a4},
            {:_, :_, :_},
            {42, :"$1", :"$2"},
            {:"$1", :"$1", :_},
            :"$1",
            [:not_a_tuple]
          ] do
        same(t, fn m, tab -> m.match(tab, pattern) end)
        same(t, fn m, tab -> m.match_object(tab, pattern) end)
        expected = Enum.sort(:ets.match(elem(t, 0), pattern))
        assert Enum.sort(walk(Heft.match(elem(t, 1), pattern, 50), 50, &Heft.match/1)) == expected
        expected = Enum.sort(:ets.match_object(elem(t, 0), pattern))
        got = walk(Heft.match_object(elem(t, 1), pattern, 50), 50, &Heft.match_object/1)
        assert Enum.sort(got) == expected
      end
    end
  end

  describe "select_delete and match_delete" do
    test "delete what ETS deletes and count it" do
      for spec <- [
            [{{:_, 3, :_}, [], [true]}],
            [{{:"$1", :_, :_}, [{:>, :"$1", 1900}], [true]}, {{:_, 1, :_}, [], [:nope]}],
            [{{:"$1", :_, :"$2"}, [{:is_binary, :"$2"}], [{:<, :"$1", 1000}]}],
            [{{7, :_, :_}, [], [true]}, {{8, :_, :_}, [], [true]}],
            [{:_, [], [true]}],
            [{{:"$1", :_, :_}, [], [{:+, :"$1", :a}]}]
          ] do
        t = pair()
        same(t, fn m, tab -> m.select_delete(tab, spec) end)
        contents(t)
      end
    end

    test "match_delete" do
      t = pair()
      same(t, fn m, tab -> m.match_delete(tab, {:_, 4, :_}) end)
      contents(t)
    end

    test "an object changed since the spec saw it is not deleted" do
      {_e, h} = pair()
      Heft.insert(h, {5, :changed, :a0})
      assert Heft.Native.delete_objects_cpu(h.ref, [{5, 5, :a0}, {6, 6, "s6"}]) == 1
      assert Heft.lookup(h, 5) == [{5, :changed, :a0}]
      assert Heft.lookup(h, 6) == []
    end

    test "a short list is deleted on the normal scheduler, as far as its budget goes" do
      h = Heft.new(:quick_delete, [:public])
      big = {:big, :binary.copy("x", 1_000_000)}
      small = for k <- 1..5, do: {k, :v}
      Heft.insert(h, [big | small])
      [a, b | others] = small

      # Small objects: done in the call, absent ones not counted.
      assert Heft.Native.delete_objects(h.ref, [a, b, {99, :v}]) == 2
      # The big record's decoding would go beyond the budget: the objects
      # before it are deleted, it and those after it come back untouched.
      assert {:more, 1, [^big | rest]} =
               Heft.Native.delete_objects(h.ref, [hd(others), big | tl(others)])

      assert rest == tl(others)
      assert Heft.lookup(h, :big) == [big]
      # First in the list, it is the dirty scheduler's at once; so is a
      # list longer than a normal call takes.
      assert Heft.Native.delete_objects(h.ref, [big]) == :"$heft_cpu"
      assert Heft.Native.delete_objects(h.ref, List.duplicate({1, :v}, 65)) == :"$heft_cpu"
      assert Heft.Native.delete_objects_cpu(h.ref, [big | rest]) == 1 + length(rest)
      assert Heft.tab2list(h) == []
      # A bag's key may hold very many objects to compare: dirty.
      b = Heft.new(:quick_delete_bag, [:bag, :public])
      Heft.insert(b, [{1, :a}, {1, :b}])
      assert Heft.Native.delete_objects(b.ref, [{1, :a}]) == :"$heft_cpu"
      assert Heft.select_delete(b, [{{1, :a}, [], [true]}]) == 1
      assert Heft.lookup(b, 1) == [{1, :b}]
    end

    test "select_delete counts every object it deletes, big and small, scattered" do
      h = Heft.new(:scattered_delete, [:public])

      objects =
        for k <- 1..3_000,
            do: {k, rem(k, 300), if(rem(k, 700) == 0, do: :binary.copy("y", 300_000), else: k)}

      Heft.insert(h, objects)
      # Ten objects, two of them big: a normal call stops at the first
      # big one, the rest goes on.
      assert Heft.select_delete(h, [{{:_, 100, :_}, [], [true]}]) == 10
      assert Heft.select_delete(h, [{{:_, 0, :"$1"}, [{:is_binary, :"$1"}], [true]}]) == 1
      assert Heft.select_delete(h, [{{:"$1", :_, :_}, [{:>, :"$1", 2_000}], [true]}]) == 996
      assert Heft.info(h, :size) == 3_000 - 10 - 1 - 996
    end

    test "a concurrent writer is never undone" do
      # The writer turns objects into {k, :keep, _} while select_delete
      # removes {_, :old, _}. Deleting by key instead of by exact object
      # would lose some of the writer's objects.
      h = Heft.new(:concurrent_delete, [:public])
      keys = 1..20_000
      Heft.insert(h, for(k <- keys, do: {k, :old, k}))
      parent = self()

      spawn_link(fn ->
        for k <- Enum.shuffle(keys), rem(k, 2) == 0, do: Heft.insert(h, {k, :keep, k})
        send(parent, :written)
      end)

      deleted = Heft.select_delete(h, [{{:_, :old, :_}, [], [true]}])
      assert_receive :written, 30_000
      # Every odd key was :old throughout, so it is gone; every even key
      # ends as the writer left it, whether select_delete got there first
      # (then the writer inserted it again) or not.
      assert Enum.sort(Heft.tab2list(h)) == for(k <- keys, rem(k, 2) == 0, do: {k, :keep, k})
      assert deleted in 10_000..20_000
    end
  end

  describe "select_replace" do
    test "replace what ETS replaces and count it" do
      for spec <- [
            [{{:"$1", 3, :"$2"}, [], [{{:"$1", 30, :"$2"}}]}],
            [{{:"$1", :"$2", :_}, [{:<, :"$1", 10}], [{{:"$1", :"$2", :small, :extra}}]}],
            [{{:_, :_, :a1}, [], [:"$_"]}],
            [{{5, :_, :_}, [], [{:const, {5, :five}}]}],
            [{{:"$1", :_, :_}, [], [{{{:element, 1, :"$_"}, :by_element}}]}],
            [{{:"$1", :"$2", :"$3"}, [{:is_binary, :"$3"}], [{{:"$1", {:+, :"$2", 1}, :"$3"}}]}]
          ] do
        t = pair()
        same(t, fn m, tab -> m.select_replace(tab, spec) end)
        contents(t)
      end
    end

    test "a spec that may change the key raises and replaces nothing, as in ETS" do
      for spec <- [
            [{{:"$1", :_, :_}, [], [{{{:+, :"$1", 1}, :x}}]}],
            [{{:"$1", :_, :_}, [], [{{5, :x}}]}],
            [{:"$1", [], [:"$1"]}],
            [{{:"$1", :_, :_}, [], [{:const, {:"$1", :x}}]}],
            [{{:_, :_, :_}, [], [{{:_, :x}}]}],
            [{{:"$1", 3, :_}, [], [:"$_"]}, {{:"$1", :_, :_}, [], [{{:"$2", 1}}]}]
          ] do
        t = {e, h} = pair()
        assert_raise ArgumentError, fn -> :ets.select_replace(e, spec) end
        assert_raise ArgumentError, fn -> Heft.select_replace(h, spec) end
        contents(t)
      end
    end

    test "an object changed meanwhile is looked up again" do
      {_e, h} = pair()
      Heft.insert(h, {5, :changed, :a0})
      pairs = [{{5, :new, :a0}, {5, 5, :a0}}, {{6, :new, "s6"}, {6, 6, "s6"}}]
      assert {1, [{5, 5, :a0}]} = Heft.Native.replace_objects_cpu(h.ref, pairs)
      assert Heft.lookup(h, 5) == [{5, :changed, :a0}]
      assert Heft.lookup(h, 6) == [{6, :new, "s6"}]
    end

    test "a concurrent counter is never lost" do
      # select_replace tags every object while another process increments
      # counters in the same objects; a replace that ignored the increment
      # would lose it.
      h = Heft.new(:concurrent_replace, [:public])
      keys = 1..10_000
      Heft.insert(h, for(k <- keys, do: {k, 0, :old}))
      parent = self()

      spawn_link(fn ->
        for k <- Enum.shuffle(keys), do: Heft.update_counter(h, k, {2, 1})
        send(parent, :counted)
      end)

      n = Heft.select_replace(h, [{{:"$1", :"$2", :old}, [], [{{:"$1", :"$2", :new}}]}])
      assert_receive :counted, 30_000
      assert n == 10_000
      assert Enum.sort(Heft.tab2list(h)) == for(k <- keys, do: {k, 1, :new})
    end
  end

  describe "bound keys are looked up, not scanned" do
    setup do
      h = Heft.new(:bound, [:public])
      Heft.insert(h, for(i <- 1..10_000, do: {i, {:user, i}, rem(i, 10)}))
      Heft.insert(h, for(i <- 1..100, do: {{:user, i}, :tuple_key}))
      %{h: h}
    end

    test "the planner finds keys in heads and in pinning guards", %{h: h} do
      cases = [
        {[{{42, :_, :_}, [], [:"$_"]}], [42]},
        {[{{{:user, 42}, :"$1"}, [], [:"$1"]}], [{:user, 42}]},
        {[{{:"$1", :_, :_}, [{:"=:=", :"$1", 7}], [:"$_"]}], [7]},
        {[{{:"$1", :_, :_}, [{:"=:=", {:const, 7}, :"$1"}], [:"$_"]}], [7]},
        {[{{:"$1", :_, :_}, [{:==, :"$1", 7}], [:"$_"]}], [7, 7.0]},
        {[{{{:user, :"$1"}, :_}, [{:andalso, {:is_integer, :"$1"}, {:"=:=", :"$1", 3}}], [1]}],
         [{:user, 3}]},
        {[{{:"$1", :_, :_}, [{:"=:=", :"$1", {{:user, {:+, 1, 1}}}}], [:"$_"]}], [{:user, 2}]},
        {[{{1, :_, :_}, [], [1]}, {{2, :_, :_}, [], [2]}, {{1, :_}, [], [3]}], [1, 2]},
        {[{{:"$1", :_, :_}, [{:"=:=", :"$1", 1}, {:"=:=", :"$1", 2}], [1]}], []},
        {[{:not_a_tuple, [], [1]}, {{}, [], [1]}], []},
        {fun2ms("fun({K, V, _}) when K =:= Wanted -> V end", Wanted: 77), [77]},
        {fun2ms("fun({{user, N}, V}) when N == 42 -> V end"), [{:user, 42}, {:user, 42.0}]}
      ]

      for {spec, keys} <- cases do
        assert Select.plan(h.ref, spec) == {:lookup, keys}, inspect(spec)
      end

      # A key without variables is looked up, maps included, where ETS does
      # (OTP 26 and older: it then finds only that key, not the larger maps
      # it matches); from OTP 27 a map in a key matches larger maps, and the
      # table is scanned, as ETS scans it.
      for {spec, key} <- [
            {[{{%{a: 1}, :_}, [], [1]}], %{a: 1}},
            {[{{{:m, %{a: 1}}, :_}, [], [1]}], {:m, %{a: 1}}}
          ] do
        want = if Heft.VM.fact(:map_key_is_pattern), do: :scan, else: {:lookup, [key]}
        assert Select.plan(h.ref, spec) == want, inspect(spec)
      end

      for spec <- [
            [{{:"$1", :_, :_}, [{:>, :"$1", 7}], [:"$_"]}],
            [{{:_, :_, :_}, [], [:"$_"]}],
            [{:_, [], [:"$_"]}],
            [{{:"$1", :_, :_}, [{:orelse, {:"=:=", :"$1", 1}, {:"=:=", :"$1", 2}}], [1]}],
            [{{%{a: :"$2"}, :_}, [], [1]}],
            [{{:"$1", :_}, [{:"=:=", :"$1", 2}], [1]}, {{%{a: 1}, :_}, [], [1]}],
            [{{1, :_, :_}, [], [1]}, {{:"$1", :_, :_}, [], [2]}],
            [{{:"$1", :"$2", :_}, [{:"=:=", :"$1", :"$2"}], [1]}]
          ] do
        assert Select.plan(h.ref, spec) == :scan, inspect(spec)
      end
    end

    test "a bound-key select decodes only the objects it looks up", %{h: h} do
      e = :ets.new(:bound, [])
      :ets.insert(e, Heft.tab2list(h))

      for {spec, looked_up} <- [
            {[{{42, :_, :_}, [], [:"$_"]}], 1},
            {[{{{:user, 42}, :"$1"}, [], [:"$1"]}], 1},
            {[{{:"$1", :_, :_}, [{:==, :"$1", 7}], [:"$_"]}], 1},
            {for(k <- 1..300, do: {{k, :"$1", :_}, [], [:"$1"]}), 300}
          ] do
        assert Enum.sort(Heft.select(h, spec)) == Enum.sort(:ets.select(e, spec))
        assert %{chunks: 0, objects: ^looked_up} = Select.stats()
        assert Heft.select_count(h, spec) == :ets.select_count(e, spec)
        assert %{chunks: 0} = Select.stats()
      end

      assert Heft.select_delete(h, [{{42, :_, :_}, [], [true]}]) == 1
      assert %{chunks: 0, objects: 1} = Select.stats()
      assert Heft.select_replace(h, [{{43, :"$1", :_}, [], [{{43, :"$1", :x}}]}]) == 1
      assert %{chunks: 0, objects: 1} = Select.stats()
      assert Heft.lookup(h, 43) == [{43, {:user, 43}, :x}]

      # ... while a scan decodes what its sieve keeps: the objects whose
      # key is above 7, of three elements ({user, i} keys are above 7 too),
      # and, since it keeps nearly everything, some of the 108 others
      # (after a long run of kept records it judges only a sample).
      Heft.select(h, [{{:"$1", :_, :_}, [{:>, :"$1", 7}], [:"$_"]}])
      assert %{lookups: 0, objects: decoded} = Select.stats()
      assert decoded in 9_992..10_100
    end

    test "a sieve that stops judging a run of kept records judges again once one drops" do
      h = Heft.new(:runs, [:ordered_set])
      e = :ets.new(:runs, [:ordered_set])
      objects = for i <- 1..10_000, do: {i, if(i <= 5_000, do: :a, else: :b)}
      Heft.insert(h, objects)
      :ets.insert(e, objects)
      spec = [{{:_, :a}, [], [:"$_"]}]
      assert Heft.select(h, spec) == :ets.select(e, spec)
      # The first :b is at most a sample's width past the last :a judged;
      # every later :b is judged and dropped undecoded.
      assert %{objects: decoded} = Select.stats()
      assert decoded in 5_000..5_008
    end
  end

  describe "ordered_set: key order, select_reverse, key ranges" do
    # Keys of many shapes, so that a range has neighbours on both sides:
    # numbers (integers and floats), {:user, n}, {:group, g, n}, improper
    # and proper lists, binaries.
    setup do
      objects =
        for i <- 1..3_000 do
          key =
            case rem(i, 7) do
              0 -> i
              1 -> i * 1.0 + 0.5
              2 -> {:user, i}
              3 -> {:group, rem(i, 5), i}
              4 -> [:a | i]
              5 -> [:b, i]
              6 -> "bin#{i}"
            end

          {key, rem(i, 10), i}
        end

      %{pair: pair(objects, [:ordered_set]), size: length(objects)}
    end

    @range_specs [
      [{{{:user, :_}, :_, :_}, [], [:"$_"]}],
      [{{{:group, 3, :_}, :"$1", :_}, [{:>, :"$1", 4}], [:"$1"]}],
      [{{[:a | :_], :_, :"$2"}, [], [:"$2"]}],
      [{{:"$1", :_, :_}, [{:>=, :"$1", 100}, {:<, :"$1", 200}], [:"$_"]}],
      [{{:"$1", :_, :_}, [{:andalso, {:>, :"$1", 100.5}, {:"=<", :"$1", 300}}], [:"$1"]}],
      [{{:"$1", :_, :_}, [{:>, 1500, :"$1"}], [:"$1"]}],
      [{{:"$1", :_, :_}, [{:>, :"$1", {:const, [:b, 2000]}}], [:"$1"]}],
      [{{:"$1", :_, :_}, [{:>=, :"$1", 10}, {:>, :"$1", 10}, {:<, :"$1", 5.0e3}], [:"$1"]}],
      [{{{:user, :"$2"}, :_, :_}, [{:<, :"$2", 50}], [:"$_"]}],
      [{{{:user, :"$1"}, :_, :_}, [], [:"$1"]}, {{{:user, :"$1"}, :_, :_}, [], [:"$1"]}],
      [{{{:nobody, :_}, :_, :_}, [], [:"$_"]}],
      [{{:"$1", :_, :_}, [{:>, :"$1", 10}, {:<, :"$1", 5}], [:"$_"]}]
    ]

    test "select, select_reverse and their limits give ETS's results in ETS's order",
         %{pair: pair} do
      for spec <- @range_specs ++ [[{:_, [], [:"$_"]}], [{{:"$1", :_, 7}, [], [:"$1"]}]] do
        ordered(pair, &select_all(&1, &2, spec, :select))
        ordered(pair, &select_all(&1, &2, spec, :select_reverse))
        ordered(pair, & &1.select(&2, spec))
        ordered(pair, & &1.select_reverse(&2, spec))
        ordered(pair, & &1.select_count(&2, Heft.MatchSpec.with_object(spec)))
      end
    end

    test "a key range is walked, not the table", %{pair: {e, h}, size: size} do
      for spec <- @range_specs do
        assert {:range, _, _} = Select.plan(h.ref, spec), inspect(spec)
        in_range = :ets.select_count(e, Heft.MatchSpec.with_object(spec))

        for fun <- [:select, :select_reverse] do
          apply(Heft, fun, [h, spec])
          %{objects: decoded} = Select.stats()
          # What is decoded holds every match, and not the whole table.
          assert decoded >= in_range and decoded < size / 2, inspect({fun, spec, decoded})
        end
      end

      # Exactly the range is decoded: {:user, _}, and 100 =< k < 200.
      for spec <- [
            [{{{:user, :_}, :_, :_}, [], [true]}],
            [{{:"$1", :_, :_}, [{:>=, :"$1", 100}, {:<, :"$1", 200}], [true]}]
          ] do
        Heft.select_reverse(h, spec)
        assert Select.stats().objects == :ets.select_count(e, spec)
      end
    end

    test "select_count, select_delete and select_replace over a range", %{pair: pair} do
      spec = [{{{:group, :"$1", :_}, :_, :_}, [{:<, :"$1", 2}], [true]}]
      same(pair, & &1.select_count(&2, spec))
      same(pair, & &1.select_delete(&2, spec))
      same(pair, & &1.tab2list(&2))

      replace = [
        {{{:user, :"$1"}, :"$2", :_}, [{:<, :"$1", 500}], [{{{{:user, :"$1"}}, :"$2", :new}}]}
      ]

      same(pair, & &1.select_replace(&2, replace))
      same(pair, & &1.tab2list(&2))
    end

    test "planned ranges" do
      h = Heft.new(:plans, [:ordered_set])
      w = :"$heft_wildcard"

      for {spec, plan} <- [
            {[{{{:user, :_}, :_}, [], [1]}], {:range, {{:user, w}, true}, {{:user, w}, true}}},
            {[{{{:a, :"$1", :c}, :_}, [], [1]}],
             {:range, {{:a, w, w}, true}, {{:a, w, w}, true}}},
            {[{{[1, 2 | :_], :_}, [], [1]}], {:range, {[1, 2 | w], true}, {[1, 2 | w], true}}},
            {[{{[?3 | :"$1"], :_}, [], [1]}], {:range, {[?3 | w], true}, {[?3 | w], true}}},
            {[{{{:m, %{a: :_}}, :_}, [{:"=:=", 1, 1}], [1]}, {{{:m, 1}, :_}, [], [1]}],
             {:range, {{:m, w}, true}, {{:m, w}, true}}},
            # Clauses bound and partly bound: from the smallest to the greatest.
            {[{{{:a, :_}, :_}, [], [1]}, {{{:b, :_}, :_}, [], [1]}],
             {:range, {{:a, w}, true}, {{:b, w}, true}}},
            {[{{{:b, 1, :_}, :_}, [], [1]}, {{{:a, :_}, :_}, [], [1]}, {{{:b, 2}, :_}, [], [1]}],
             {:range, {{:a, w}, true}, {{:b, 1, w}, true}}},
            {[{{:"$1", :_}, [{:>, :"$1", 1}, {:>=, :"$1", 1.0}], [1]}],
             {:range, {1, false}, nil}},
            {[{{:"$1", :_}, [{:"=<", 9, :"$1"}, {:<, :"$1", :z}], [1]}],
             {:range, {9, true}, {:z, false}}},
            {[{{:"$1", :_}, [{:andalso, {:<, :"$1", 5}, {:is_integer, :"$1"}}], [1]}],
             {:range, nil, {5, false}}}
          ] do
        assert Select.plan(h.ref, spec) == plan, inspect(spec)
      end

      for spec <- [
            [{{:"$1", :_}, [{:orelse, {:<, :"$1", 5}, {:>, :"$1", 9}}], [1]}],
            [{{:"$1", :"$2"}, [{:<, :"$1", :"$2"}], [1]}],
            [{{:_, :_}, [], [1]}],
            [{{{:a, :_}, :_}, [], [1]}, {{:"$1", :_}, [], [1]}]
          ] do
        assert Select.plan(h.ref, spec) == :scan, inspect(spec)
      end

      # Bound keys: in key order, one of each `==` pair (the same key here).
      spec = [{{:"$1", :_}, [{:==, :"$1", 2}], [1]}, {{1, :_}, [], [1]}]
      assert Select.plan(h.ref, spec) == {:lookup, [1, 2]}
      Heft.insert(h, [{1.0, :one}, {2, :two}])
      assert Heft.select(h, [{{:"$1", :_}, [{:==, :"$1", 1}], [:"$_"]}]) == [{1.0, :one}]
    end
  end

  describe "partly bound and map keys in an ordered_set, as ETS walks them" do
    test "a list key with a bound head and an open tail finds every list with that head" do
      pair =
        pair([{~c"3", 0}, {~c"30", 1}, {~c"31", 2}, {~c"4", 3}, {[?3 | :x], 4}, {[], 5}], [
          :ordered_set
        ])

      for spec <- [
            [{{[?3 | :"$1"], :_}, [], [:"$1"]}],
            [{{[?3, :_ | :_], :_}, [], [:"$_"]}],
            [{{[:_ | :x], :_}, [], [:"$_"]}]
          ] do
        ordered(pair, & &1.select(&2, spec))
        ordered(pair, & &1.select_reverse(&2, spec))
        ordered(pair, &select_all(&1, &2, spec, :select))
      end

      same(pair, & &1.select_delete(&2, [{{[?3 | :_], :_}, [], [true]}]))
      same(pair, & &1.tab2list(&2))
    end

    test "clauses bound to maps: one key is looked up, several are walked between" do
      # ETS looks a key without variables up by equality, so the map
      # pattern in it finds only that key when it is alone; with other
      # bound or partly bound clauses it walks from the smallest to the
      # greatest, where the map pattern also matches larger maps (OTP 25:
      # whether the bound keys are in the table or not).
      objects = [{{:a, %{x: 1, y: 2}}}, {{:b, 1}}, {{:c, %{x: 1}}}, {%{x: 1.0}}, {%{x: 1, y: 2}}]
      pair = pair(objects, [:ordered_set])

      for spec <- [
            [{{{:a, %{x: 1}}}, [], [:"$_"]}],
            [{{{:a, %{x: 1}}}, [], [:"$_"]}, {{{:b, :_}}, [], [:"$_"]}],
            [{{{:a, %{x: 1}}}, [], [:"$_"]}, {{{:b, 1}}, [], [:"$_"]}],
            [{{{:a, %{x: 1}}}, [], [:"$_"]}, {{{:a, %{x: 1.0}}}, [], [:"$_"]}],
            [{{%{x: 1}}, [], [:"$_"]}],
            [{{%{x: 1}}, [], [:"$_"]}, {{{:c, :_}}, [], [:"$_"]}],
            [{{%{x: :_}}, [], [:"$_"]}, {{{:c, :_}}, [], [:"$_"]}]
          ] do
        ordered(pair, & &1.select(&2, spec))
        ordered(pair, & &1.select_reverse(&2, spec))
        ordered(pair, & &1.select_count(&2, Heft.MatchSpec.with_object(spec)))
      end
    end
  end

  # Asserts equal results, order included.
  defp ordered({e, h}, fun), do: assert(fun.(Heft, h) == fun.(:ets, e))

  # Every result of a select/3 (or select_reverse/3) walk in small batches.
  defp select_all(m, t, spec, fun) do
    Stream.unfold(apply(m, fun, [t, spec, 7]), fn
      :"$end_of_table" -> nil
      {results, cont} -> {results, apply(m, fun, [cont])}
    end)
    |> Enum.concat()
  end

  describe "file arenas and persistent tables" do
    @describetag :tmp_dir

    test "a file arena's walks and writes go through dirty I/O schedulers", %{tmp_dir: dir} do
      e = :ets.new(:file_arena, [:public])
      h = Heft.new(:file_arena, [:public, arena: {:file, dir}])
      :ets.insert(e, @objects)
      Heft.insert(h, @objects)
      t = {e, h}
      same(t, fn m, tab -> m.select(tab, [{{:"$1", 3, :_}, [], [:"$1"]}]) end)
      same(t, fn m, tab -> m.select(tab, [{{77, :_, :_}, [], [:"$_"]}]) end)
      same(t, fn m, tab -> m.select_delete(tab, [{{:_, 4, :_}, [], [true]}]) end)
      same(t, fn m, tab -> m.select_replace(tab, [{{:"$1", 2, :_}, [], [{{:"$1", 0, :x}}]}]) end)
      contents(t)
    end

    test "deletes and replaces of a persistent table are logged", %{tmp_dir: dir} do
      dir = Path.join(dir, "persisted")
      h = Heft.new(:persisted_select, [:public, persist: dir, sync: :commit])
      Heft.insert(h, @objects)
      assert Heft.select_delete(h, [{{:_, 4, :_}, [], [true]}]) == 286
      assert Heft.select_replace(h, [{{:"$1", 2, :_}, [], [{{:"$1", 0, :x}}]}]) == 286
      expected = Enum.sort(Heft.tab2list(h))
      assert Heft.close(h) == :ok
      {:ok, h} = Heft.open(dir)
      assert Enum.sort(Heft.tab2list(h)) == expected
      assert Heft.select_count(h, [{{:_, 0, :x}, [], [true]}]) == 286
      Heft.delete(h)
    end
  end

  describe "access" do
    test "a private table raises for other processes, a protected one for writes" do
      priv = Heft.new(:priv, [:private])
      prot = Heft.new(:prot, [:protected])
      Heft.insert(prot, {1, 2})
      spec = [{:_, [], [true]}]

      Task.async(fn ->
        assert_raise ArgumentError, fn -> Heft.select(priv, spec) end
        assert_raise ArgumentError, fn -> Heft.select_count(priv, spec) end
        assert Heft.select(prot, spec) == [true]
        assert_raise ArgumentError, fn -> Heft.select_delete(prot, [{{3, :_}, [], [true]}]) end
        assert_raise ArgumentError, fn -> Heft.select_replace(prot, [{:_, [], [:"$_"]}]) end
      end)
      |> Task.await()
    end

    test "a table that does not exist raises" do
      assert_raise ArgumentError, fn -> Heft.select(:no_such_heft_table, [{:_, [], [true]}]) end
      assert_raise ArgumentError, fn -> Heft.match(:no_such_heft_table, :_) end
    end
  end
end
