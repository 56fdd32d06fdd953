defmodule Heft.SelectChunksTest do
  # select/3 and its family in chunks, and the select functions that write,
  # against the running VM's ETS: what a continuation sees of the writes
  # made between its calls, the order of a bag key's objects across chunks,
  # and objects that differ only in the sign of a zero.
  use ExUnit.Case, async: true

  # -0.0, made at run time (a literal -0.0 is 0.0 to the compiler on
  # OTP 26 and older).
  defp nz, do: :erlang.binary_to_term(<<131, 70, 128, 0, 0, 0, 0, 0, 0, 0>>)

  # Exact: 0.0 and -0.0 differ.
  defp exact(term), do: :erlang.term_to_binary(term)

  defp both(opts, fun) do
    ets = fun.(:ets, :ets.new(:chunks, opts))
    heft = fun.(Heft, Heft.new(:chunks, opts))
    assert exact(heft) == exact(ets), "Heft: #{inspect(heft)}\nETS:  #{inspect(ets)}"
    ets
  end

  # Sorted bit for bit, so that 0.0 and -0.0 have one order.
  defp sorted(objects), do: Enum.sort_by(objects, &exact/1)

  # Every chunk of a select/3-like call, continued with `more`.
  defp chunks(:"$end_of_table", _more), do: []
  defp chunks({results, cont}, more), do: [results | chunks(more.(cont), more)]

  test "an ordered_set continuation reads the table as it is at the next call" do
    both([:ordered_set], fn m, t ->
      m.insert(t, for(k <- 1..6, do: {k, :old}))
      {first, cont} = m.select(t, [{:_, [], [:"$_"]}], 1)
      m.insert(t, {3, :new})
      m.delete(t, 4)
      m.insert(t, {7, :added})
      [first | chunks(m.select(cont), &m.select/1)]
    end)
  end

  test "an ordered_set range bound by a map: where ETS stops walking past its end" do
    # A map in a bound key matches larger maps, which sort after it (OTP 26
    # and older, where such a key bounds ETS's walk); ETS checks the range's
    # end only in a call's first 1000 objects, so its continuations and
    # select_reverse/2 find some larger maps past the end. Thousands of
    # objects on either side of the end, 1000 and more in the range.
    for {in_range, past} <- [{300, 40}, {999, 1}, {1000, 5}, {1500, 2500}, {2600, 700}] do
      objects =
        for(i <- 1..in_range, do: {{:t, i}}) ++
          for(i <- 1..past, do: {%{a: :b, n: i}}) ++ for(i <- 1..300, do: {[i]})

      spec = [{{%{a: :b}}, [], [:"$_"]}, {{{:t, :"$1"}}, [{:>, :"$1", 10}], [:"$_"]}]

      both([:ordered_set], fn m, t ->
        m.insert(t, objects)

        walks =
          for limit <- [1, 7, 500, 999, 1000, 1001, 5000],
              fun <- [:select, :select_reverse, :match_object] do
            first =
              if fun == :match_object,
                do: m.match_object(t, {%{a: :b}}, limit),
                else: apply(m, fun, [t, spec, limit])

            chunks(first, &apply(m, fun, [&1]))
          end

        {walks, m.select(t, spec), m.select_reverse(t, spec), m.select_count(t, spec)}
      end)
    end
  end

  test "an ordered_set range ETS cuts short: clause keys whose numbers are == but not the same type" do
    # ETS picks the keys its walk starts and ends at by its own comparison
    # of the clause keys, which stops, undecided, at 1 against 1.0: of
    # [1, 0] and [1.0 | _] it walks to [1, 0] and misses [1.0, 5]; of two
    # bound keys [1, 0] and [1.0, 5] it looks up the first alone. Its
    # continuations walk on past the end, in either direction.
    objects =
      for(i <- -3..3, do: {[1, i]}) ++
        for(i <- -3..3, do: {[1.0, i + 10]}) ++
        for(i <- -3..3, do: {[2.0, i]}) ++
        [{[2, 0]}, {1}, {[0]}, {[3]}, {[{1, 2, 3}, 0]}, {[{1, 2}, 5]}, {[{1, 2}, 7]}]

    specs = [
      [{{[1, 0]}, [], [:"$$"]}, {{1}, [], [:"$_"]}, {{[1.0 | :"$3"]}, [], [:"$_"]}],
      [{{[1.0 | :"$1"]}, [], [:"$_"]}, {{[1, 0]}, [], [:"$_"]}],
      [{{[1, 0]}, [], [:"$_"]}, {{[1.0, 10]}, [], [:"$_"]}],
      [{{[2, 0]}, [], [:"$_"]}, {{[2.0 | :"$1"]}, [], [:"$_"]}],
      [{{[2.0, :_]}, [], [:"$_"]}, {{[2, 0]}, [], [:"$_"]}],
      # A shorter tuple is undecided for "greater": ETS walks to the end
      # of [{1, 2} | _] and misses the bound key.
      [{{[{1, 2, 3}, 0]}, [], [:"$_"]}, {{[{1, 2} | :"$1"]}, [], [:"$_"]}]
    ]

    both([:ordered_set], fn m, t ->
      m.insert(t, objects)

      for spec <- specs do
        walks =
          for limit <- [1, 2, 100], fun <- [:select, :select_reverse] do
            chunks(apply(m, fun, [t, spec, limit]), &apply(m, fun, [&1]))
          end

        {walks, m.select(t, spec), m.select_reverse(t, spec), m.select_count(t, spec)}
      end
    end)
  end

  test "ordered_set continuations of every size and direction, with writes between calls" do
    :rand.seed(:exsss, {28, 1, 1})

    for _round <- 1..40 do
      limit = Enum.random(1..5)
      seed = :rand.uniform(1_000_000)

      for fun <- [:select, :select_reverse] do
        both([:ordered_set], fn m, t ->
          :rand.seed(:exsss, {seed, 2, 3})
          m.insert(t, for(k <- 1..30, do: {k, rem(k, 4)}))
          spec = [{{:"$1", :"$2"}, [{:<, :"$2", 3}], [{{:"$1", :"$2"}}]}]
          walk(m, apply(m, fun, [t, spec, limit]), t, fun)
        end)
      end
    end
  end

  # Continues a walk to its end, writing at random between the calls.
  defp walk(_m, :"$end_of_table", _t, _fun), do: []

  defp walk(m, {results, cont}, t, fun) do
    for _ <- 1..:rand.uniform(3) do
      k = :rand.uniform(35)

      case :rand.uniform(3) do
        1 -> m.insert(t, {k, :rand.uniform(4) - 1})
        2 -> m.delete(t, k)
        3 -> m.insert(t, {k, 0})
      end
    end

    [results | walk(m, apply(m, fun, [cont]), t, fun)]
  end

  test "a bag key's objects come back in ETS's order when they span chunks" do
    for type <- [:bag, :duplicate_bag], n <- [5, 7], limit <- [1, 2, 3, 10] do
      both([type], fn m, t ->
        for i <- 1..n, do: m.insert(t, {:k, i})
        m.insert(t, {:j, 0})
        spec = [{{:k, :"$1"}, [], [:"$1"]}]

        [
          chunks(m.select(t, spec, limit), &m.select/1),
          chunks(m.select_reverse(t, spec, limit), &m.select_reverse/1),
          chunks(m.match(t, {:k, :"$1"}, limit), &m.match/1),
          chunks(m.match_object(t, {:k, :_}, limit), &m.match_object/1)
        ]
      end)
    end
  end

  test "a bag key's objects looked up by key come back in ETS's order across chunks" do
    both([:bag], fn m, t ->
      for i <- 1..6, do: m.insert(t, {:k, i})
      chunks(m.select(t, [{{:k, :"$1"}, [], [:"$1"]}], 4), &m.select/1)
    end)
  end

  test "select_delete and match_delete delete only objects the spec matches, sign of zero included" do
    for type <- [:set, :ordered_set, :bag, :duplicate_bag] do
      both([type], fn m, t ->
        m.insert(t, [{:k, 0.0}, {:k, nz()}, {:j, nz()}])
        deleted = m.select_delete(t, [{{:_, nz()}, [], [true]}])
        [deleted, sorted(m.tab2list(t))]
      end)

      both([type], fn m, t ->
        m.insert(t, [{0.0}, {nz()}, {1, 0.0}])
        m.match_delete(t, {0.0})
        m.match_delete(t, {1, nz()})
        sorted(m.tab2list(t))
      end)
    end
  end

  test "select_replace writes a result that differs only in the sign of a zero" do
    for type <- [:set, :ordered_set, :duplicate_bag] do
      both([type], fn m, t ->
        m.insert(t, [{:k, 0.0}, {:j, 1}])
        replaced = m.select_replace(t, [{{:"$1", 0.0}, [], [{{:"$1", nz()}}]}])
        [replaced, sorted(m.tab2list(t))]
      end)
    end
  end
end
