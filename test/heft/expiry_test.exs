defmodule Heft.ExpiryTest do
  # Expiry (`ttl:` of new/2, open/2, insert/3 and insert_new/3): an expired
  # key is gone for every call at once, the sweep removes it and counts it,
  # writes set deadlines as documented, persistent tables log the removals.
  # Times are either 0 (expired when the write returns) or an hour (not
  # expired while a test runs), so that no result depends on how fast the
  # machine is; the few tests of a deadline passing wait for it to pass.
  # The core's own tests are in heft_core's table.rs.
  use ExUnit.Case, async: true

  @types [:set, :ordered_set, :bag, :duplicate_bag]
  @hour 3_600_000

  defp tmp_dir(tag) do
    dir = Path.join(System.tmp_dir!(), "heft-expiry-#{tag}-#{System.unique_integer([:positive])}")
    File.rm_rf!(dir)
    on_exit(fn -> File.rm_rf!(dir) end)
    dir
  end

  # Waits until `fun` answers true (the sweep runs every 100 ms).
  defp eventually(fun, tries \\ 200) do
    cond do
      fun.() -> :ok
      tries == 0 -> flunk("never came true")
      true -> Process.sleep(25) && eventually(fun, tries - 1)
    end
  end

  # Every way of reading the table, as one term: what a table without the
  # expired keys would answer.
  defp view(t, keys) do
    %{
      size: Heft.info(t, :size),
      list: Enum.sort(Heft.tab2list(t)),
      lookups: for(k <- keys, do: Heft.lookup(t, k)),
      members: for(k <- keys, do: Heft.member(t, k)),
      elements: for(k <- keys, do: Heft.lookup_element(t, k, 2, :none)),
      select: Enum.sort(Heft.select(t, [{:_, [], [:"$_"]}])),
      select_chunks: chunks(Heft.select(t, [{:_, [], [:"$_"]}], 1)),
      reverse: Enum.sort(Heft.select_reverse(t, [{:_, [], [:"$_"]}])),
      match: Enum.sort(Heft.match_object(t, {:_, :_})),
      count: Heft.select_count(t, [{:_, [], [true]}]),
      count_guard: Heft.select_count(t, [{{:_, :"$1"}, [{:is_atom, :"$1"}], [true]}]),
      fold: Enum.sort(Heft.foldl(fn o, acc -> [o | acc] end, [], t)),
      stream: Enum.sort(Enum.to_list(Heft.stream(t))),
      walk: Enum.sort(walk(t, Heft.first(t), [])),
      back: Enum.sort(walk_back(t, Heft.last(t), [])),
      slots: Enum.sort(slots(t, 0, []))
    }
  end

  defp chunks(:"$end_of_table"), do: []
  defp chunks({objs, cont}), do: Enum.sort(objs ++ chunks(Heft.select(cont)))

  defp walk(_t, :"$end_of_table", acc), do: acc
  defp walk(t, k, acc), do: walk(t, Heft.next(t, k), [k | acc])

  defp walk_back(_t, :"$end_of_table", acc), do: acc
  defp walk_back(t, k, acc), do: walk_back(t, Heft.prev(t, k), [k | acc])

  defp slots(t, i, acc) do
    case Heft.slot(t, i) do
      :"$end_of_table" -> acc
      objs -> slots(t, i + 1, objs ++ acc)
    end
  end

  # The same calls on a table that only ever had `writes` inserted, in
  # order (a bag keeps its objects in the order they came).
  defp expected(type, writes, keys) do
    t = Heft.new(:expected, [type])
    Enum.each(writes, &Heft.insert(t, &1))
    v = view(t, keys)
    Heft.delete(t)
    v
  end

  test "an expired key is gone for every read at once, in every table type" do
    for type <- @types do
      t = Heft.new(:expiring, [type, ttl: @hour])
      live = [{:a, :x}, {:b, :y}, {:b, :z}, {:c, 1}]
      Heft.insert(t, live)
      Heft.insert(t, [{:d, :gone}, {:e, :gone}], ttl: 0)
      Heft.insert(t, {:f, :kept}, ttl: :infinity)
      Heft.insert(t, {:g, :gone}, ttl: 0)
      keys = [:a, :b, :c, :d, :e, :f, :g, :h]
      assert view(t, keys) == expected(type, [live, {:f, :kept}], keys), inspect(type)
      assert_raise ArgumentError, fn -> Heft.lookup_element(t, :d, 2) end
      assert Heft.take(t, :d) == []
      assert Heft.insert_new(t, {:e, :new}) == true
      assert Heft.lookup(t, :e) == [{:e, :new}]
      Heft.delete(t)
    end
  end

  test "past thousands of expired keys not yet swept, walk steps and counts answer" do
    # More than a normal scheduler's call passes over (256 keys for a
    # walk step, 2,048 for a count): those calls go on on a dirty one.
    for type <- @types do
      t = Heft.new(:backlog, [type])
      Heft.insert(t, for(i <- 1..5_000, do: {i, i}), ttl: 0)
      Heft.insert(t, {:live, 1})
      assert {Heft.first(t), Heft.last(t)} == {:live, :live}, inspect(type)
      assert Heft.info(t, :size) == 1
      assert Heft.select_count(t, [{:_, [], [true]}]) == 1
      assert Heft.tab2list(t) == [{:live, 1}]
      Heft.delete(t)
    end
  end

  test "writes to an expired key find it gone: counters start again, element updates miss" do
    for type <- [:set, :ordered_set] do
      t = Heft.new(:counters, [type])
      Heft.insert(t, {:n, 41}, ttl: 0)
      assert Heft.update_counter(t, :n, 1, {:n, 100}) == 101
      Heft.insert(t, {:m, 1}, ttl: 0)
      assert Heft.update_element(t, :m, {2, :new}) == false
      assert_raise ArgumentError, fn -> Heft.update_counter(t, :m, 1) end
      assert Heft.lookup(t, :m) == []
      Heft.insert(t, {:o, 1}, ttl: 0)
      assert Heft.delete(t, :o) == true
      assert Heft.select_delete(t, [{:_, [], [true]}]) == 1
      Heft.delete(t)
    end

    for type <- [:bag, :duplicate_bag] do
      t = Heft.new(:bags, [type])
      Heft.insert(t, [{:k, 1}, {:k, 2}], ttl: 0)
      Heft.insert(t, {:k, 3})
      assert Heft.lookup(t, :k) == [{:k, 3}], "the expired objects do not come back"
      Heft.insert(t, [{:j, 1}, {:j, 2}], ttl: 0)
      assert Heft.delete_object(t, {:j, 1}) == true
      assert Heft.lookup(t, :j) == []
      Heft.delete(t)
    end
  end

  test "the deadline: set by inserts (their ttl, else the table's), kept by updates" do
    t = Heft.new(:deadlines, [:set])
    Heft.insert(t, {:a, 1}, ttl: 0)
    Heft.insert(t, {:a, 2})
    assert Heft.lookup(t, :a) == [{:a, 2}], "an insert without ttl in a table without one"
    assert Heft.info(t, :expiry).expiring_keys == 0

    u = Heft.new(:deadlines, [:set, ttl: @hour])
    Heft.insert(u, {:a, 1}, ttl: 0)
    Heft.insert(u, {:a, 2})
    assert Heft.lookup(u, :a) == [{:a, 2}], "a later insert sets the table's"
    Heft.insert(u, {:b, 1}, ttl: :infinity)
    assert Heft.info(u, :expiry).expiring_keys == 1

    # Updates keep the deadline (had they set the table's, an hour, or
    # none, the key would stay).
    Heft.insert(u, {:c, 1}, ttl: 2_000)
    Heft.update_counter(u, :c, 1)
    Heft.update_element(u, :c, {2, 7})
    Heft.select_replace(u, [{{:c, :"$1"}, [], [{{:c, {:+, :"$1", 1}}}]}])
    eventually(fn -> Heft.lookup(u, :c) == [] end, 400)
    assert Heft.lookup(u, :a) == [{:a, 2}]
  end

  test "an ordered_set's key replaced by an equal one (1 and 1.0) takes the new write's deadline" do
    t = Heft.new(:equal_keys, [:ordered_set])
    Heft.insert(t, {1, :int}, ttl: 0)
    Heft.insert(t, {1.0, :float}, ttl: :infinity)
    assert Heft.lookup(t, 1) == [{1.0, :float}]
    Heft.insert(t, {1, :int}, ttl: 0)
    assert Heft.lookup(t, 1.0) == []
    assert Heft.tab2list(t) == []
    assert Heft.info(t, :size) == 0
  end

  test "the sweep removes expired keys on its own and counts them" do
    for type <- @types do
      t = Heft.new(:swept, [type, ttl: 50])
      for i <- 1..2_000, do: Heft.insert(t, {i, i})
      Heft.insert(t, {:stays, 1}, ttl: :infinity)
      assert Heft.info(t, :expiry).expiring_keys == 2_000

      eventually(fn -> Heft.info(t, :expiry).expired_keys == 2_000 end)
      info = Heft.info(t, :expiry)
      assert %{ttl: 50, expiring_keys: 0, expired_records: 2_000} = info
      assert Heft.info(t, :size) == 1
      assert Heft.info(t, :payload_raw_bytes) < 100, "the records' memory is released"
      Heft.delete(t)
    end
  end

  test "info(:expiry) is nil without deadlines, and counts the deadlines' bytes in :memory" do
    t = Heft.new(:plain, [])
    Heft.insert(t, {1, 1})
    assert Heft.info(t, :expiry) == nil
    before = Heft.info(t, :memory)
    Heft.insert(t, for(i <- 1..1_000, do: {i, i}), ttl: @hour)
    e = Heft.info(t, :expiry)
    assert %{ttl: nil, expiring_keys: 1_000, expired_keys: 0} = e
    assert e.bytes >= 1_000 * 50
    assert Heft.info(t, :memory) >= before + e.bytes
  end

  test "a persistent table logs removals of expired keys; deadlines are not stored" do
    for type <- @types do
      dir = tmp_dir(type)
      t = Heft.new(:pexpiry, [type, persist: dir])
      Heft.insert(t, [{:a, 1}, {:b, 2}])
      Heft.insert(t, {:gone, 1}, ttl: 0)
      Heft.insert(t, {:later, 1}, ttl: 40)
      eventually(fn -> Heft.info(t, :expiry).expired_keys == 2 end)
      :ok = Heft.close(t)

      {:ok, t} = Heft.open(dir)
      assert Enum.sort(Heft.tab2list(t)) == [{:a, 1}, {:b, 2}]
      assert Heft.info(t, :expiry) == nil
      # Expired but not yet swept: close/1 removes it first.
      Heft.insert(t, {:closed, 1}, ttl: 0)
      :ok = Heft.close(t)
      {:ok, t} = Heft.open(dir)
      assert Enum.sort(Heft.tab2list(t)) == [{:a, 1}, {:b, 2}]
      :ok = Heft.close(t)

      # Opened with a ttl: every key gets it from now.
      {:ok, t} = Heft.open(dir, ttl: 40)
      assert Heft.info(t, :expiry).expiring_keys == 2
      eventually(fn -> Heft.info(t, :expiry).expired_keys == 2 end)
      assert Heft.info(t, :size) == 0
      :ok = Heft.close(t)
      {:ok, t} = Heft.open(dir)
      assert Heft.tab2list(t) == []
      Heft.delete(t)
    end
  end

  test "random writes with ttl 0 or none against a model, every table type" do
    for type <- @types, seed <- 1..3 do
      :rand.seed(:exsss, {seed, 7, 11})
      t = Heft.new(:model, [type])

      model =
        Enum.reduce(1..3_000, %{}, fn _, m ->
          k = :rand.uniform(60)
          v = :rand.uniform(4)

          case :rand.uniform(6) do
            1 -> Heft.insert(t, {k, v}, ttl: 0) && Map.delete(m, k)
            2 -> Heft.delete(t, k) && Map.delete(m, k)
            3 -> insert_new(t, m, k, v)
            _ -> Heft.insert(t, {k, v}, ttl: :infinity) && put(m, type, k, v)
          end
        end)

      want = for {k, vs} <- model, v <- Enum.reverse(vs), do: {k, v}
      assert Enum.sort(Heft.tab2list(t)) == Enum.sort(want), inspect({type, seed})
      assert Heft.info(t, :size) == length(want)
      for k <- 1..60, do: assert(Heft.member(t, k) == Map.has_key?(model, k))
      Heft.delete(t)
    end
  end

  defp insert_new(t, m, k, v) do
    assert Heft.insert_new(t, {k, v}, ttl: :infinity) == not Map.has_key?(m, k)
    Map.put_new(m, k, [v])
  end

  # The model holds each key's values, latest first.
  defp put(m, type, k, v) when type in [:set, :ordered_set], do: Map.put(m, k, [v])

  defp put(m, :bag, k, v),
    do: Map.update(m, k, [v], &if(v in &1, do: &1, else: [v | &1]))

  defp put(m, :duplicate_bag, k, v), do: Map.update(m, k, [v], &[v | &1])

  test "bad ttl options are refused, and a refused write changes nothing" do
    for opt <- [ttl: 0, ttl: -1, ttl: 1.5, ttl: :soon, ttl: 9_223_372_036_854_775_808] do
      assert_raise ArgumentError, ~r/invalid value/, fn -> Heft.new(:bad, [opt]) end
    end

    t = Heft.new(:bad, [])

    for opt <- [ttl: -1, ttl: 1.5, ttl: nil, ttl: "1"] do
      assert_raise ArgumentError, ~r/invalid value/, fn -> Heft.insert(t, {1, 1}, [opt]) end
      assert_raise ArgumentError, ~r/invalid value/, fn -> Heft.insert_new(t, {1, 1}, [opt]) end
    end

    assert Heft.tab2list(t) == []
    assert Heft.info(t, :expiry) == nil
  end
end
