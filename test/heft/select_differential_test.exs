defmodule Heft.SelectDifferentialTest do
  # Thousands of random match specifications (Heft.Test.MatchSpecGen) run
  # against :ets and Heft tables of each type holding the same random
  # contents; every result must be equal (in the same order for an
  # ordered_set, whose results come in key order; order aside for the
  # others) and every badarg must be an ArgumentError on both sides. The seed is ExUnit's (`mix test --seed N` reproduces a
  # run) unless HEFT_MS_SEED is set, and every failure message carries it.
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

  defp tables(objects, keypos) do
    type = Process.get(:type)
    e = :ets.new(:diff, [type, :public, keypos: keypos])
    h = Heft.new(:diff, [type, :public, keypos: keypos])
    for o <- objects, do: :ets.insert(e, o) && Heft.insert(h, o)
    {e, h}
  end

  defp run(rounds, specs_per_round) do
    seed = seed()
    :rand.seed(:exsss, seed)

    for round <- 1..rounds do
      type = Enum.at([:set, :ordered_set, :bag, :duplicate_bag], rem(round, 4))
      Process.put(:type, type)
      keypos = Enum.random([1, 1, 1, 2])
      objects = Gen.objects(150 + :rand.uniform(250), keypos)
      {e, h} = tables(objects, keypos)

      for i <- 1..specs_per_round do
        where = "seed #{seed}, round #{round}, spec #{i}, #{type}, keypos #{keypos}"
        spec = Gen.spec(keypos)
        check(e, h, spec, where)

        if rem(i, 8) == 0,
          do: check_writes(objects, keypos, spec, Gen.replace_spec(keypos), where)
      end

      :ets.delete(e)
      Heft.delete(h)
    end
  end

  defp check(e, h, spec, where) do
    msg = fn what -> "#{what} differs (#{where}): #{inspect(spec)}" end
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
  end

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

  test "random specs give ETS's results, all four table types" do
    run(60, 200)
  end

  @tag :slow
  @tag timeout: 600_000
  test "random specs give ETS's results (long run)" do
    run(300, 300)
  end
end
