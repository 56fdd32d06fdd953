defmodule Heft.StructuralSharingTest do
  # A set's or ordered_set's record body stores structurally equal compound
  # subterms once (docs/term-format.md, "Sharing"), however the record was
  # built: a lookup answers a term =:= to the one written, with those parts
  # shared (smaller by :erts_debug.size/1). Bag bodies stay canonical.
  use ExUnit.Case, async: true
  import Bitwise

  # A copy with no sharing at all, as a term read from a socket, a file or
  # Mnesia's transaction store arrives.
  defp unshared(term), do: term |> :erlang.term_to_binary() |> :erlang.binary_to_term()

  defp tuple100(i), do: unshared({:t, i, :erlang.make_tuple(100, List.duplicate(:a, 10))})

  # Equal and bit for bit the same (on OTP 26 and older 0.0 =:= -0.0).
  defp assert_exact(got, want) do
    assert got === want
    assert :erlang.term_to_binary(got) == :erlang.term_to_binary(want)
  end

  for type <- [:set, :ordered_set] do
    test "#{type}: an unshared 100-tuple record comes back equal and sharing one list" do
      tab = Heft.new(:sharing, [unquote(type)])
      rec = tuple100(1)
      assert :erts_debug.size(rec) == 2105 and :erts_debug.flat_size(rec) == 2105
      true = Heft.insert(tab, rec)

      [got] = Heft.lookup(tab, :t)
      assert_exact(got, rec)
      # 4 words of record tuple, 101 of the 100-tuple, 20 of one list.
      assert :erts_debug.size(got) == 125
      assert [^got] = Heft.tab2list(tab)
      assert :erts_debug.size(Heft.lookup_element(tab, :t, 3)) == 121
    end
  end

  # The encoder tells atoms, small integers and [] by their tag bits and
  # reads list cells in place where the VM's layout is the one it checked
  # at load (native/heft_nif/src/codec.rs, check_term_layout), and writes a
  # tuple or list of immediates whole.
  test "terms are read in place on this VM" do
    assert Heft.Native.term_layout_checked()
  end

  test "immediates at their edges, improper lists and flat compounds come back exact" do
    small = (1 <<< 59) - 1

    edges = [
      0,
      -1,
      127,
      128,
      small,
      small + 1,
      -small - 1,
      -small - 2,
      1 <<< 63,
      -(1 <<< 64)
    ]

    atoms = for i <- 1..100, do: String.to_atom("heft_layout_atom_#{i}")

    values = [
      edges,
      List.to_tuple(edges),
      atoms,
      [1, 2 | 3],
      [:a | :b],
      [1 | []],
      [[]],
      [[], []],
      {[]},
      {},
      [{}],
      [1.5, 2, :a],
      [1 | 2.5],
      [:a, "bin", :a],
      {:a, :a, :a, :a},
      List.duplicate(:x, 5000),
      List.duplicate({1, 2}, 300),
      for(i <- 1..300, do: [i, :k, -i]),
      %{a: [1, 2], b: {:c, :d}},
      # Runs of equal flat compounds inside compounds merged in turn.
      {List.duplicate({:a, 2}, 5), List.duplicate({:a, 2}, 5), {List.duplicate({:a, 2}, 5), 1},
       {List.duplicate({:a, 2}, 5), 1}, {:a, 2}, List.duplicate({:a, 2}, 5), {:a, 2}, [1, 2],
       [1, 2], {[1, 2]}, [1, 2]},
      # Lists next to an equal one but for a longer, shorter or improper
      # end, and at the 16-element bound of lists not tracked by identity.
      [[:a, :b], [:a, :b, :c], [:a, :b | :c], [:a], [:a, :b], [:a, :b], [:b, :b]],
      {[1, 2], [1, 2 | 3], [1, 2], [1, 2 | []], [1]},
      List.duplicate(Enum.to_list(1..16), 3) ++ List.duplicate(Enum.to_list(1..17), 3)
    ]

    for type <- [:set, :ordered_set, :bag] do
      tab = Heft.new(:layout, [type])

      for {v, i} <- Enum.with_index(values) do
        rec = {i, unshared(v), v}
        true = Heft.insert(tab, rec)
        [got] = Heft.lookup(tab, i)
        assert_exact(got, rec)
        # As a key too.
        true = Heft.insert(tab, {v, i})
        assert [{^v, ^i}] = Heft.lookup(tab, v)
      end

      Heft.delete(tab)
    end
  end

  test "short compounds of immediates shared by identity come back shared" do
    # Not tracked by identity (codec.rs, SHORT_FLAT_*): merged by structure
    # into the same refs.
    l = [1, 2, 3]
    t3 = {:a, :b, 7}
    long = Enum.to_list(1..40)
    rec = {:k, [l, l, t3, l, t3, {l, t3}, long, long]}
    tab = Heft.new(:layout_shared, [:set])
    true = Heft.insert(tab, rec)
    [got] = Heft.lookup(tab, :k)
    assert_exact(got, rec)
    # Each shared part once (the flat copy is 218 words; the record as
    # built shares them in 122).
    assert :erts_debug.flat_size(rec) == 218
    assert :erts_debug.size(got) <= :erts_debug.size(rec)
  end

  test "a list longer than a normal scheduler's budget is encoded all the same" do
    tab = Heft.new(:layout_long, [:set])
    long = Enum.to_list(1..2_000_000)
    true = Heft.insert(tab, {:long, long})
    assert [{:long, ^long}] = Heft.lookup(tab, :long)
  end

  test "bag bodies stay canonical: an unshared record comes back unshared" do
    for type <- [:bag, :duplicate_bag] do
      tab = Heft.new(:sharing_bag, [type])
      rec = tuple100(1)
      true = Heft.insert(tab, rec)
      [got] = Heft.lookup(tab, :t)
      assert_exact(got, rec)
      assert :erts_debug.size(got) == 2105
    end
  end

  test "equal parts that differ in a float's sign, a map value or a binary stay apart" do
    neg = -1 * 0.0
    parts = [[neg, 1], [0.0, 1], %{a: 1, b: "xy"}, %{a: 2, b: "xy"}, "abcd", "abce", [1 | :x]]
    rec = unshared({:k, parts, Enum.reverse(parts), parts})
    tab = Heft.new(:sharing_apart, [:set])
    true = Heft.insert(tab, rec)
    [got] = Heft.lookup(tab, :k)
    assert_exact(got, rec)
    assert :erts_debug.size(got) < :erts_debug.size(rec)
    {:k, [[n | _] | _], _, _} = got
    assert :erlang.term_to_binary(n) == :erlang.term_to_binary(neg)
  end

  test "a part merged away forgets the identities noted inside it" do
    # `small` (too short to merge) gets an id inside d2; d2 is merged into
    # d1 and its id goes to `fresh`: `small` met again must not be read as
    # `fresh`.
    small = {:erlang.phash2(:x, 100)}
    p = :lists.seq(1, 4)
    d1 = unshared({small, p, p})
    d2 = {small, p, p}
    fresh = {300, 301}
    rec = {:k, d1, d2, fresh, small}
    tab = Heft.new(:sharing_rollback, [:set])
    true = Heft.insert(tab, rec)
    [got] = Heft.lookup(tab, :k)
    assert_exact(got, rec)
  end

  # Random nested terms drawn from a few pieces, so that equal parts recur;
  # each part is built afresh (no sharing) or, sometimes, reused.
  defp random_term(_state, 0), do: leaf()

  defp random_term(pool, depth) do
    case :rand.uniform(12) do
      n when n <= 3 -> leaf()
      4 -> Enum.random(pool)
      5 -> List.to_tuple(for _ <- 1..:rand.uniform(4), do: random_term(pool, depth - 1))
      6 -> for _ <- 1..:rand.uniform(4), do: random_term(pool, depth - 1)
      7 -> [random_term(pool, depth - 1) | random_term(pool, depth - 1)]
      8 -> Map.new(1..:rand.uniform(3), &{&1, random_term(pool, depth - 1)})
      9 -> %{random_term(pool, depth - 1) => random_term(pool, depth - 1)}
      _ -> Enum.random(pool) |> unshared()
    end
  end

  defp leaf do
    Enum.random([
      :a,
      :b,
      1,
      300,
      -5,
      1 <<< 70,
      1.5,
      0.0,
      -1 * 0.0,
      "bin",
      "longer binary",
      <<1::3>>,
      [],
      {},
      %{},
      self(),
      make_ref(),
      &Kernel.+/2
    ])
  end

  defp pieces(depth) do
    base = [[:a, :a, :a], {1, 2, "bin"}, %{x: [1.5, -1 * 0.0]}, [1 | 2], {self(), 1 <<< 70}]
    Enum.reduce(1..4, base, fn _, acc -> [random_term(acc, depth) | acc] end)
  end

  for type <- [:set, :ordered_set] do
    test "#{type}: random nested terms with recurring parts come back exactly as written" do
      for seed <- 1..200 do
        :rand.seed(:exsss, {seed, 7, 11})
        pool = pieces(3)
        recs = for i <- 1..10, do: {i, random_term(pool, 5), random_term(pool, 4)}
        tab = Heft.new(:sharing_random, [unquote(type)])
        true = Heft.insert(tab, recs)
        true = Heft.insert(tab, Enum.map(recs, &unshared/1))

        for rec <- recs do
          assert [got] = Heft.lookup(tab, elem(rec, 0)), "seed #{seed}"
          assert_exact(got, rec)
          assert :erts_debug.size(got) <= :erts_debug.flat_size(rec)
        end

        Heft.delete(tab)
      end
    end
  end
end
