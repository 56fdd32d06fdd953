defmodule Heft.TypesTest do
  # :ordered_set, :bag and :duplicate_bag side by side with :ets: each test
  # runs the same calls on an ETS table and a Heft table of one type and
  # expects the same answers, exactly (term_to_binary equal, so 0.0 and -0.0
  # differ) and the same exceptions.
  use ExUnit.Case, async: true

  # -0.0, made at run time: as literals, terms that differ only in the sign
  # of a zero are one (the compiler's literal pool matches them by =:=, and
  # on OTP 25 0.0 =:= -0.0), so `{:a, -0.0}` next to `{:a, 0.0}` in the code
  # would silently be the same term.
  defp nz, do: :erlang.binary_to_term(<<131, 70, 128, 0, 0, 0, 0, 0, 0, 0>>)

  # Runs `fun.(m, tab)` on a new table of `type` of each backend; asserts
  # the results are the same and returns Heft's. `fun` wraps each call it
  # makes in `s/1`, so one exception does not hide the calls after it.
  defp same(type, fun) do
    ets = fun.(:ets, :ets.new(:types, [type, :public]))
    heft = fun.(Heft, Heft.new(:types, [type, :public]))
    assert exact(heft) == exact(ets), difference(heft, ets)
    heft
  end

  # Where two answers first differ, found through nested lists.
  defp difference(heft, ets, path \\ [])

  defp difference(h, e, path) when is_list(h) and is_list(e) do
    pairs = if List.improper?(h) or List.improper?(e), do: [], else: Enum.zip(h, e)

    case Enum.find_index(pairs, fn {x, y} -> exact(x) != exact(y) end) do
      nil -> "at #{inspect(path)}:\nHeft: #{inspect(h)}\n:ets: #{inspect(e)}"
      i -> difference(Enum.at(h, i), Enum.at(e, i), path ++ [i])
    end
  end

  defp difference(h, e, path),
    do: "at #{inspect(path)}:\nHeft: #{inspect(h)}\n:ets: #{inspect(e)}"

  defp s(f) do
    {:ok, f.()}
  rescue
    e -> {:raise, e.__struct__}
  end

  defp exact(term), do: :erlang.term_to_binary(term, [:deterministic])

  # A whole table whose key order is unspecified (hash tables): each key's
  # objects in their order, keys sorted by their exact encoding.
  defp by_key(m, tab) do
    m.tab2list(tab)
    |> Enum.group_by(&exact(elem(&1, 0)))
    |> Enum.sort()
  end

  describe "bag" do
    test "a key's objects come back in insertion order; a list goes in last to first" do
      same(:bag, fn m, t ->
        [
          s(fn -> for o <- [{:k, 3}, {:k, 1}, {:j, 0}, {:k, 2}], do: m.insert(t, o) end),
          s(fn -> m.lookup(t, :k) end),
          s(fn -> m.insert(t, [{:k, 5}, {:k, 4}, {:k, 3}, {:j, 1}]) end),
          s(fn -> m.lookup(t, :k) end),
          s(fn -> m.lookup(t, :j) end),
          s(fn -> m.info(t, :size) end)
        ]
      end)
    end

    test "an object matching one already there is not added and keeps its place" do
      same(:bag, fn m, t ->
        [
          s(fn -> m.insert(t, [{:k, 1}, {:k, 2}, {:k, 1}]) end),
          s(fn -> m.insert(t, {:k, 1}) end),
          s(fn -> m.lookup(t, :k) end),
          # 1 and 1.0 differ, as keys and as elements.
          s(fn -> m.insert(t, [{:k, 1.0}, {1, :a}, {1.0, :a}]) end),
          s(fn -> m.lookup(t, :k) end),
          s(fn -> m.lookup(t, 1) end),
          s(fn -> m.info(t, :size) end)
        ]
      end)
    end

    test "0.0 and -0.0 match (OTP 25 and older): the object stored first stays" do
      same(:bag, fn m, t ->
        [
          s(fn -> m.insert(t, {:a, nz()}) end),
          s(fn -> m.insert(t, {:a, 0.0}) end),
          s(fn -> m.insert(t, {:b, 0.0}) end),
          s(fn -> m.insert(t, {:b, nz()}) end),
          s(fn -> m.insert(t, [{:c, nz(), [%{nz() => 1}]}, {:c, 0.0, [%{0.0 => 1}]}]) end),
          s(fn -> m.insert(t, {nz(), :x}) end),
          s(fn -> m.insert(t, {0.0, :x}) end),
          s(fn -> m.insert(t, {0.0, :y}) end),
          s(fn -> {m.lookup(t, :a), m.lookup(t, :b), m.lookup(t, :c), m.lookup(t, 0.0)} end),
          # A walk reports the key of each key's last object, as ETS does.
          s(fn -> keys(m, t) end),
          s(fn -> m.delete_object(t, {:a, 0.0}) end),
          s(fn -> m.lookup(t, :a) end)
        ]
      end)
    end

    test "lookup_element gives each object's element; take, delete, delete_object, member" do
      same(:bag, fn m, t ->
        [
          s(fn -> m.insert(t, [{:k, 1, :x}, {:k, 2}, {:j, 3, :y}]) end),
          s(fn -> m.lookup_element(t, :k, 2) end),
          s(fn -> m.lookup_element(t, :k, 3) end),
          s(fn -> m.lookup_element(t, :missing, 2) end),
          s(fn -> m.lookup_element(t, :j, 3) end),
          s(fn -> m.member(t, :k) end),
          s(fn -> m.delete_object(t, {:k, 2.0}) end),
          s(fn -> m.delete_object(t, {:k, 2}) end),
          s(fn -> m.lookup(t, :k) end),
          s(fn -> m.take(t, :k) end),
          s(fn -> m.take(t, :k) end),
          s(fn -> m.member(t, :k) end),
          s(fn -> m.delete(t, :j) end),
          s(fn -> m.info(t, :size) end)
        ]
      end)
    end

    test "insert_new is false if the key has any object; update_* raise" do
      same(:bag, fn m, t ->
        [
          s(fn -> m.insert(t, {:k, 1}) end),
          s(fn -> m.insert_new(t, {:k, 2}) end),
          s(fn -> m.insert_new(t, [{:n, 1}, {:k, 3}]) end),
          s(fn -> m.insert_new(t, [{:n, 1}, {:n, 2}, {:n, 1}]) end),
          s(fn -> m.lookup(t, :n) end),
          s(fn -> m.update_counter(t, :k, 1) end),
          s(fn -> m.update_counter(t, :z, 1, {:z, 0}) end),
          s(fn -> m.update_element(t, :k, {2, 5}) end),
          s(fn -> m.lookup(t, :k) end)
        ]
      end)
    end

    test "traversal visits each key once; foldl and foldr give a key's objects in and against order" do
      for type <- [:bag, :duplicate_bag] do
        same(type, fn m, t ->
          m.insert(t, for(k <- 1..50, v <- [3, 1, 2, 1], do: {k, v}))
          keys = walk(m, t, m.first(t), [])
          folds = fn fold -> m |> apply(fold, [fn o, acc -> [o | acc] end, [], t]) |> group() end

          [
            s(fn -> Enum.sort(keys) end),
            s(fn -> length(m.tab2list(t)) == m.info(t, :size) end),
            s(fn -> folds.(:foldl) end),
            s(fn -> folds.(:foldr) end),
            s(fn -> by_key(m, t) end)
          ]
        end)
      end
    end
  end

  describe "duplicate_bag" do
    test "copies are kept in order; delete_object removes every copy, of either zero" do
      same(:duplicate_bag, fn m, t ->
        [
          s(fn -> m.insert(t, [{:k, 3}, {:k, 1}, {:j, 0}, {:k, 3}]) end),
          s(fn -> m.insert(t, {:k, 1}) end),
          s(fn -> m.lookup(t, :k) end),
          s(fn -> m.lookup_element(t, :k, 2) end),
          s(fn -> m.delete_object(t, {:k, 3}) end),
          s(fn -> m.lookup(t, :k) end),
          s(fn -> m.insert(t, [{:z, nz()}, {:z, 0.0}, {:z, 0}]) end),
          s(fn -> m.insert(t, [{nz(), 1}, {0.0, 2}]) end),
          s(fn -> keys(m, t) end),
          s(fn -> m.delete_object(t, {:z, 0.0}) end),
          s(fn -> m.lookup(t, :z) end),
          s(fn -> m.insert_new(t, [{:n, 1}, {:n, 1}]) end),
          s(fn -> m.take(t, :n) end),
          s(fn -> m.update_counter(t, :k, 1) end),
          s(fn -> m.info(t, :size) end)
        ]
      end)
    end
  end

  describe "ordered_set" do
    test "keys compare by ==: the key of the object inserted last is kept" do
      same(:ordered_set, fn m, t ->
        [
          s(fn -> m.insert(t, {1.0, :a}) end),
          s(fn -> m.insert(t, {1, :b}) end),
          s(fn -> m.lookup(t, 1.0) end),
          s(fn -> m.insert(t, [{2, :x}, {2.0, :y}]) end),
          s(fn -> m.lookup(t, 2) end),
          s(fn -> m.insert_new(t, [{3, :x}, {3.0, :y}]) end),
          s(fn -> m.insert_new(t, {3, :z}) end),
          s(fn -> m.lookup(t, 3) end),
          s(fn -> m.insert(t, [{{1, 2.0}, :t}, {{1.0, 2}, :u}, {nz(), :nz}, {0, :zero}]) end),
          s(fn -> m.tab2list(t) end),
          s(fn -> m.member(t, {1.0, 2.0}) end),
          s(fn -> m.info(t, :size) end)
        ]
      end)
    end

    test "delete_object matches the whole object exactly; take and delete by ==" do
      same(:ordered_set, fn m, t ->
        [
          s(fn -> m.insert(t, [{1, :b}, {5, :v}, {6, 1}]) end),
          s(fn -> m.delete_object(t, {1.0, :b}) end),
          s(fn -> m.delete_object(t, {5, :v}) end),
          s(fn -> m.tab2list(t) end),
          s(fn -> m.take(t, 6.0) end),
          s(fn -> m.delete(t, 1.0) end),
          s(fn -> m.tab2list(t) end)
        ]
      end)
    end

    test "update_counter and update_element find the key by == and keep it" do
      same(:ordered_set, fn m, t ->
        [
          s(fn -> m.insert(t, {6, 1, :a}) end),
          s(fn -> m.update_counter(t, 6.0, 1) end),
          s(fn -> m.update_counter(t, 7.0, {2, 1}, {7, 10, :d}) end),
          s(fn -> m.update_element(t, 7, {3, :z}) end),
          s(fn -> m.update_element(t, 8, {3, :z}) end),
          s(fn -> m.lookup_element(t, 7, 3) end),
          s(fn -> m.tab2list(t) end)
        ]
      end)
    end

    test "first, last, next and prev walk in term order, from keys present or not" do
      same(:ordered_set, fn m, t ->
        [
          s(fn -> {m.first(t), m.last(t), m.next(t, 1), m.prev(t, 1)} end),
          s(fn -> m.insert(t, for(k <- [10, 20, 30, :atom, "bin", {1}], do: {k})) end),
          s(fn -> {m.first(t), m.last(t)} end),
          s(fn ->
            for k <- [0, 10, 15, 20.0, 30, 31, :atom, :zzz, "a", {0}, {2}], do: m.next(t, k)
          end),
          s(fn ->
            for k <- [0, 10, 15, 20.0, 30, 31, :atom, :zzz, "a", {0}, {2}], do: m.prev(t, k)
          end),
          s(fn -> walk(m, t, m.first(t), []) end),
          s(fn -> m.foldl(fn {k}, acc -> [k | acc] end, [], t) end),
          s(fn -> m.foldr(fn {k}, acc -> [k | acc] end, [], t) end)
        ]
      end)
    end
  end

  describe "scheduling" do
    test "a bag key with many objects is worked on a dirty scheduler; a few stay normal" do
      t = Heft.new(:busy, [:bag, :public])
      ref = t.ref
      Heft.insert(t, for(i <- 1..2_000, do: {:many, i, :binary.copy(<<i::16>>, 50)}))
      Heft.insert(t, [{:few, 1}, {:few, 2}])
      # Comparing with 2,000 objects, or decoding 200 KB, is no normal job.
      assert Heft.Native.insert(ref, {:many, 0, "new"}) == :"$heft_cpu"
      assert Heft.Native.lookup(ref, :many) == :"$heft_cpu"
      assert Heft.Native.delete_object(ref, {:many, 1, "x"}) == :"$heft_cpu"
      assert Heft.Native.delete_key(ref, :many) == :"$heft_cpu"
      assert Heft.info(t, :size) == 2_002, "the normal calls changed nothing"
      few = if Heft.VM.fact(:bag_batch_reversed), do: [few: 2, few: 1], else: [few: 1, few: 2]
      assert Heft.Native.lookup(ref, :few) == few, "one list, in the VM's order"
      assert Heft.Native.insert(ref, {:few, 3}) == true
      # Heft's own calls get there.
      assert Heft.insert(t, {:many, 0, "new"})
      assert length(Heft.lookup(t, :many)) == 2_001
      assert Heft.delete(t, :many)
      assert Heft.info(t, :size) == 3
    end
  end

  describe "memory" do
    test "an ordered_set's index is its own mapping, under 32 bytes a record" do
      sizes =
        for type <- [:set, :ordered_set] do
          t = Heft.new(:mem, [type])
          Heft.insert(t, for(k <- Enum.shuffle(1..50_000), do: {k, k}))
          info = Heft.info(t)
          assert info[:type] == type
          assert info[:memory] == info[:index_bytes] + info[:meta_bytes] + info[:arena_used_bytes]
          # Pages in RAM (a set may not have touched every slot page; an
          # ordered_set counts its heap directory too).
          assert info[:index_resident_bytes] > 0
          assert info[:index_resident_bytes] <= info[:index_bytes]
          assert info[:index_bytes] - info[:index_resident_bytes] < 16_384
          info[:index_bytes]
        end

      # Pages of 256 entries (a handle and an 8-byte key prefix), at
      # least a quarter full and about 70% after random inserts: 16 bytes
      # an entry, under 32 a record; the set's slots are 40% to 80% full.
      [set, ordered] = sizes
      assert ordered < 32 * 50_000, "#{ordered} bytes"
      assert ordered > 16 * 50_000, "#{ordered} bytes: each entry holds its prefix"
      assert set > 0
    end
  end

  describe "match specifications" do
    for type <- [:ordered_set, :bag, :duplicate_bag] do
      test "#{type}: select, select_delete and select_replace as :ets" do
        same(unquote(type), fn m, t ->
          objs = [{1, :a}, {1, :b}, {1, :a}, {2.0, :a}, {2, :c}, {:k, :a}, {{1}, :a}]
          all = [{:"$1", [], [:"$_"]}]

          [
            s(fn -> m.insert(t, objs) end),
            s(fn -> Enum.sort(m.select(t, all)) end),
            s(fn -> m.select(t, [{{1, :"$1"}, [], [:"$1"]}]) end),
            s(fn ->
              m.select_delete(t, [{{:_, :a}, [{:"=/=", {:element, 1, :"$_"}, :k}], [true]}])
            end),
            s(fn -> by_key(m, t) end),
            s(fn -> m.select_replace(t, [{{:"$1", :b}, [], [{{:"$1", :z}}]}]) end),
            s(fn -> by_key(m, t) end)
          ]
        end)
      end
    end
  end

  describe "persistence" do
    @describetag :tmp_dir

    # The same calls, in three sessions of a persistent Heft table (closed
    # and reopened between them, dumped in the middle one) and on one ETS
    # table: the contents agree after each reopening.
    for type <- [:set, :ordered_set, :bag, :duplicate_bag] do
      test "#{type}: contents survive close, dump and reopen as :ets holds them", ctx do
        type = unquote(type)
        dir = Path.join(ctx.tmp_dir, "p")
        ets = :ets.new(:p, [type, :public])
        t = Heft.new(:p, [type, :public, persist: dir])

        sessions = [
          [
            {:insert, [{1, :a}, {1.0, :b}, {2, :c}, {1, :d}, {1, :a}]},
            {:insert, {nz(), :z}},
            {:insert, {0.0, :z}},
            {:insert, {:k, [1, 2]}},
            {:insert_new, [{:n, 1}, {:n, 2}]}
          ],
          [
            {:delete_object, {1, :a}},
            :dump,
            {:insert, [{2, :c}, {2, :e}, {3, :f}]},
            {:take, :k},
            {:delete, 1.0}
          ],
          [
            {:insert, for(i <- 1..300, do: {rem(i, 7), i})},
            {:delete_object, {3, 10}},
            :dump,
            {:delete, 2}
          ]
        ]

        final =
          Enum.reduce(sessions, t, fn calls, t ->
            for call <- calls do
              case call do
                :dump ->
                  :ok = Heft.dump(t)

                {f, arg} ->
                  assert exact(apply(Heft, f, [t, arg])) == exact(apply(:ets, f, [ets, arg])),
                         "#{inspect(call)}"
              end
            end

            :ok = Heft.close(t)
            {:ok, t} = Heft.open(dir)
            assert Heft.info(t, :type) == type
            assert contents(Heft, t, type) == contents(:ets, ets, type)
            t
          end)

        Heft.delete(final)
      end
    end

    defp contents(m, t, :ordered_set), do: exact(m.tab2list(t))
    defp contents(m, t, _type), do: exact(by_key(m, t))
  end

  describe "random calls" do
    defp some_keys, do: [1, 1.0, 2, 0.0, nz(), :a, {1}, {1.0}, [1 | 2], "k", {nz()}, {0.0}]
    defp some_values, do: [1, 1.0, 0.0, nz(), :x, "s", %{a: 1}, %{a: 1.0}, [nz()], [0.0]]

    for type <- [:set, :ordered_set, :bag, :duplicate_bag] do
      @tag table_type: type
      test "#{type}: 2,000 random calls answer as :ets does", %{table_type: type} do
        :rand.seed(:exsss, {7, 8, byte_size(Atom.to_string(type))})
        calls = for _ <- 1..2_000, do: random_call(type)

        same(type, fn m, t ->
          answers = Enum.map(calls, fn call -> s(fn -> apply_call(m, t, call) end) end)
          final = if type == :ordered_set, do: m.tab2list(t), else: by_key(m, t)
          [answers, final, m.info(t, :size)]
        end)
      end
    end

    defp random_call(type) do
      k = Enum.random(some_keys())
      obj = fn -> {Enum.random(some_keys()), Enum.random(some_values())} end

      choices =
        [
          {:insert, obj.()},
          {:insert, for(_ <- 1..:rand.uniform(4), do: obj.())},
          {:insert_new, for(_ <- 1..:rand.uniform(3), do: obj.())},
          {:lookup, k},
          {:lookup, k},
          {:lookup_element, k, Enum.random([1, 2, 3])},
          {:member, k},
          {:take, k},
          {:delete, k},
          {:delete_object, obj.()},
          {:update_element, k, {2, Enum.random(some_values())}}
        ] ++ if type == :ordered_set, do: [{:next, k}, {:prev, k}], else: []

      Enum.random(choices)
    end

    defp apply_call(m, t, {f, a}), do: apply(m, f, [t, a])
    defp apply_call(m, t, {f, a, b}), do: apply(m, f, [t, a, b])
  end

  # The keys of a first/next walk, sorted by their exact encoding (hash
  # tables walk in an unspecified order).
  defp keys(m, t), do: Enum.sort_by(walk(m, t, m.first(t), []), &exact/1)

  defp walk(_m, _t, :"$end_of_table", acc), do: Enum.reverse(acc)
  defp walk(m, t, k, acc), do: walk(m, t, m.next(t, k), [k | acc])

  # Objects folded (most recent first) into each key's objects in fold
  # order, keys sorted by their exact encoding.
  defp group(folded) do
    folded
    |> Enum.reverse()
    |> Enum.group_by(&exact(elem(&1, 0)))
    |> Enum.sort()
  end
end
