defmodule Heft.SelectDifferentialTest do
  # Thousands of random match specifications (Heft.Test.MatchSpecGen) run
  # against :ets and Heft tables of each type holding the same random
  # contents; every result must be equal (in the same order for an
  # ordered_set, whose results come in key order; order aside for the
  # others) and every badarg must be an ArgumentError on both sides. Each
  # round's Heft table has one of the codecs (with a dictionary trained on
  # its records where the codec has one), and some walks of select/3 have
  # writes made between their calls: an ordered_set's must give ETS's
  # chunks exactly (the next call reads the table as it is then); the
  # other types' must return every object present throughout and
  # nothing that was never in the table. The seed is ExUnit's (`mix test
  # --seed N` reproduces a run) unless HEFT_MS_SEED is set, and every
  # failure message carries it.
  #
  #     mix test test/heft/select_differential_test.exs                # ~10,000 specs
  #     mix test test/heft/select_differential_test.exs --include slow # ~90,000
  use ExUnit.Case, async: true

  alias Heft.Test.MatchSpecGen, as: Gen

  defp seed do
    case System.get_env("HEFT_MS_SEED") do
      nil -> ExUnit.configuration()[:seed]
      s -> String.to_integer(s)
    end
  end

  defp outcome(fun) do
    {:ok, normalize(fun.())}
  rescue
    ArgumentError -> :badarg
  end

  # An ordered_set's results keep their order (the process dictionary
  # says which type the round runs).
  defp normalize(list) when is_list(list) do
    if Process.get(:type) == :ordered_set, do: list, else: Enum.sort(list)
  end

  defp normalize(other), do: other

  # Every result of a select/3 walk (`:badarg` if it raises).
  defp walk(first_fun, next_fun) do
    outcome(fn -> drain(first_fun.(), next_fun) end)
  end

  defp drain(:"$end_of_table", _next), do: []
  defp drain({results, cont}, next), do: results ++ drain(next.(cont), next)

  @codecs [:none, :zlib, :lz4, :zstd, {:zstd, dictionary: :auto}, :auto]

  defp tables(objects, keypos) do
    type = Process.get(:type)
    codec = Process.get(:codec)
    e = :ets.new(:diff, [type, :public, keypos: keypos])
    h = Heft.new(:diff, [type, :public, keypos: keypos, compression: codec])
    for o <- objects, do: :ets.insert(e, o) && Heft.insert(h, o)

    # Records written before the dictionary stay as they were until the
    # background re-compression reaches them: a scan meets both kinds.
    if codec in [:auto, {:zstd, dictionary: :auto}],
      do: Heft.train_dictionary(h, samples: 64)

    {e, h}
  end

  defp run(rounds, specs_per_round) do
    seed = seed()
    :rand.seed(:exsss, seed)

    for round <- 1..rounds do
      type = Enum.at([:set, :ordered_set, :bag, :duplicate_bag], rem(round, 4))
      Process.put(:type, type)
      Process.put(:codec, Enum.random(@codecs))
      keypos = Enum.random([1, 1, 1, 2])
      objects = Gen.objects(150 + :rand.uniform(250), keypos)
      {e, h} = tables(objects, keypos)

      for i <- 1..specs_per_round do
        where =
          "seed #{seed}, round #{round}, spec #{i}, #{type}, keypos #{keypos}, " <>
            "compression #{inspect(Process.get(:codec))}"

        spec = Gen.spec(keypos)
        check(e, h, spec, where)

        if rem(i, 4) == 0, do: check_interleaved(e, h, keypos, spec, where)

        if rem(i, 8) == 0,
          do: check_writes(objects, keypos, spec, Gen.replace_spec(keypos), where)
      end

      :ets.delete(e)
      Heft.delete(h)
    end
  end

  defp check(e, h, spec, where) do
    # assert/2 builds its message whether or not it fails: the spec is
    # inspected once.
    spec_text = inspect(spec)
    msg = fn what -> "#{what} differs (#{where}): #{spec_text}" end
    expected = outcome(fn -> :ets.select(e, spec) end)
    assert outcome(fn -> Heft.select(h, spec) end) == expected, msg.("select/2")

    assert outcome(fn -> Heft.select_reverse(h, spec) end) ==
             outcome(fn -> :ets.select_reverse(e, spec) end),
           msg.("select_reverse/2")

    assert outcome(fn -> Heft.select_count(h, spec) end) ==
             outcome(fn -> :ets.select_count(e, spec) end),
           msg.("select_count/2")

    limit = Enum.random([1, 2, 5, 50, 1000])
    # ETS raises for an invalid spec at the first call, as Heft does.
    assert walk(fn -> Heft.select(h, spec, limit) end, &Heft.select/1) ==
             walk(fn -> :ets.select(e, spec, limit) end, &:ets.select/1),
           msg.("select/3 limit #{limit}")

    assert walk(fn -> Heft.select_reverse(h, spec, limit) end, &Heft.select_reverse/1) ==
             walk(fn -> :ets.select_reverse(e, spec, limit) end, &:ets.select_reverse/1),
           msg.("select_reverse/3 limit #{limit}")

    [{pattern, _, _} | _] = spec

    assert outcome(fn -> Heft.match(h, pattern) end) ==
             outcome(fn -> :ets.match(e, pattern) end),
           msg.("match/2 of the first head")

    assert outcome(fn -> Heft.match_object(h, pattern) end) ==
             outcome(fn -> :ets.match_object(e, pattern) end),
           msg.("match_object/2 of the first head")

    assert walk(fn -> Heft.match(h, pattern, limit) end, &Heft.match/1) ==
             walk(fn -> :ets.match(e, pattern, limit) end, &:ets.match/1),
           msg.("match/3 of the first head, limit #{limit}")

    assert walk(fn -> Heft.match_object(h, pattern, limit) end, &Heft.match_object/1) ==
             walk(fn -> :ets.match_object(e, pattern, limit) end, &:ets.match_object/1),
           msg.("match_object/3 of the first head, limit #{limit}")
  end

  # A select/3 walk (forward or reverse) on both tables with the same
  # random writes made to both between its calls. The tables keep the
  # writes (both sides alike), so later specs see them.
  defp check_interleaved(e, h, keypos, spec, where) do
    {first, next, ets_first, ets_next} =
      Enum.random([
        {&Heft.select/3, &Heft.select/1, &:ets.select/3, &:ets.select/1},
        {&Heft.select_reverse/3, &Heft.select_reverse/1, &:ets.select_reverse/3,
         &:ets.select_reverse/1}
      ])

    limit = Enum.random([1, 2, 3, 10])
    msg = "select/3 with writes between calls differs (#{where}), limit #{limit}: "
    before = :ets.tab2list(e)
    writes = for _ <- 1..8, do: random_write(before, keypos)

    case {outcome(fn -> first.(h, spec, limit) end),
          outcome(fn -> ets_first.(e, spec, limit) end)} do
      {:badarg, :badarg} ->
        :ok

      {{:ok, h_chunk}, {:ok, e_chunk}} ->
        {h_chunks, e_chunks, seen} = interleave(h_chunk, e_chunk, next, ets_next, e, h, writes)

        # Messages are built only on a failure: they inspect whole tables.
        if Process.get(:type) == :ordered_set do
          unless h_chunks == e_chunks, do: flunk(msg <> inspect(spec))
        else
          throughout = Enum.reduce(seen, before, &common/2)
          ever = Enum.uniq(before ++ Enum.concat(seen))
          results = Enum.flat_map(h_chunks, & &1)
          must = ets_select(throughout, keypos, spec)
          may = MapSet.new(ets_select(ever, keypos, spec))

          unless Enum.sort(results -- results -- must) == Enum.sort(must) do
            flunk(
              msg <>
                "an object present throughout was missed: #{inspect(spec)}; " <>
                "chunks #{inspect(h_chunks)}, present throughout #{inspect(throughout)}"
            )
          end

          unless Enum.all?(results, &MapSet.member?(may, &1)),
            do: flunk(msg <> "a result of no object the table held: " <> inspect(spec))
        end

      other ->
        flunk(msg <> inspect(other) <> " " <> inspect(spec))
    end
  end

  # Runs both walks to their end, one of `writes` made to both tables
  # before each next call while they last; returns both walks' chunks and
  # the table after each write.
  defp interleave(h_chunk, e_chunk, next, ets_next, e, h, writes, acc \\ {[], [], []})

  defp interleave(:"$end_of_table", :"$end_of_table", _, _, _, _, _, {hs, es, seen}),
    do: {Enum.reverse(hs), Enum.reverse(es), seen}

  defp interleave(h_res, e_res, next, ets_next, e, h, writes, {hs, es, seen}) do
    {h_list, h_cont} = parts(h_res)
    {e_list, e_cont} = parts(e_res)

    {writes, seen} =
      case writes do
        [write | rest] ->
          write.(:ets, e)
          write.(Heft, h)
          {rest, [:ets.tab2list(e) | seen]}

        [] ->
          {[], seen}
      end

    acc = {[h_list | hs], [e_list | es], seen}
    interleave(step(h_cont, next), step(e_cont, ets_next), next, ets_next, e, h, writes, acc)
  end

  defp parts(:"$end_of_table"), do: {[], :"$end_of_table"}
  defp parts({list, cont}), do: {list, cont}

  defp step(:"$end_of_table", _next), do: :"$end_of_table"
  defp step(cont, next), do: next.(cont)

  # One write, the same on both tables: insert a new object, or delete one
  # of `present` (by key or as an object): the table's objects before the
  # walk.
  defp random_write(present, keypos) do
    [new] = Gen.objects(1, keypos)

    case {:rand.uniform(3), present} do
      {_, []} ->
        fn mod, tab -> mod.insert(tab, new) end

      {1, _} ->
        fn mod, tab -> mod.insert(tab, new) end

      {2, _} ->
        key = elem(Enum.random(present), keypos - 1)
        & &1.delete(&2, key)

      {3, _} ->
        object = Enum.random(present)
        & &1.delete_object(&2, object)
    end
  end

  # What the running VM's ETS selects from these objects (a duplicate_bag
  # holds them all; its lookups of bound keys are every type's).
  defp ets_select(objects, keypos, spec) do
    t = :ets.new(:expected, [:duplicate_bag, keypos: keypos])
    :ets.insert(t, objects)
    results = :ets.select(t, spec)
    :ets.delete(t)
    results
  end

  # The objects of both lists, as a multiset.
  defp common(a, b), do: a -- a -- b

  # Deletes and replaces change the tables: fresh copies each time.
  defp check_writes(objects, keypos, spec, replace_spec, where) do
    {e, h} = tables(objects, keypos)
    expected = outcome(fn -> :ets.select_delete(e, spec) end)
    msg = "select_delete differs (#{where}): #{inspect(spec)}"
    assert outcome(fn -> Heft.select_delete(h, spec) end) == expected, msg
    assert outcome(fn -> Heft.tab2list(h) end) == outcome(fn -> :ets.tab2list(e) end), msg

    expected = outcome(fn -> :ets.select_replace(e, replace_spec) end)
    msg = "select_replace differs (#{where}): #{inspect(replace_spec)}"
    assert outcome(fn -> Heft.select_replace(h, replace_spec) end) == expected, msg
    assert outcome(fn -> Heft.tab2list(h) end) == outcome(fn -> :ets.tab2list(e) end), msg
    :ets.delete(e)
    Heft.delete(h)
  end

  # About 45 s alone on this 2-core machine; more beside bin/test's other
  # async tests.
  @tag timeout: 300_000
  test "random specs give ETS's results, all four table types" do
    run(60, 200)
  end

  @tag :slow
  @tag timeout: 600_000
  test "random specs give ETS's results (long run)" do
    run(300, 300)
  end
end
