defmodule Heft.PersistZeroKeysTest do
  # A persistent table written on a VM where 0.0 and -0.0 are one key (OTP
  # 26 and older) and opened on one where they are two (OTP 27 and later),
  # and the other way round. The table records its rule in META; opened
  # under the other rule, its misfiled keys move (or, where two keys would
  # become one and an object would be lost, it is refused). Both rules are
  # played on this VM with Heft.VM.with_zero_rule/2, so the test runs on any
  # release; not async, since the rule is the whole VM's.
  use ExUnit.Case, async: false

  @moduletag :tmp_dir

  defp nz, do: :erlang.binary_to_term(<<131, 70, 128, 0, 0, 0, 0, 0, 0, 0>>)
  defp exact(term), do: :erlang.term_to_binary(term)

  defp write(dir, merged, type, objects) do
    Heft.VM.with_zero_rule(merged, fn ->
      t = Heft.new(:zero_keys, [type, persist: dir])
      for o <- objects, do: Heft.insert(t, o)
      :ok = Heft.close(t)
    end)
  end

  # What lookups, members and a walk answer for `keys`, exactly.
  defp answers(t, keys) do
    exact({
      for(k <- keys, do: {Heft.lookup(t, k), Heft.member(t, k)}),
      Enum.sort_by(Heft.tab2list(t), &exact/1),
      Heft.info(t, :size)
    })
  end

  defp same_as_ets(t, type, objects, keys) do
    e = :ets.new(:zero_keys, [type])
    for o <- objects, do: :ets.insert(e, o)

    ets =
      exact({
        for(k <- keys, do: {:ets.lookup(e, k), :ets.member(e, k)}),
        Enum.sort_by(:ets.tab2list(e), &exact/1),
        :ets.info(e, :size)
      })

    assert answers(t, keys) == ets
  end

  test "a table written where 0.0 and -0.0 are one key opens where they are two", %{tmp_dir: tmp} do
    for type <- [:set, :bag, :duplicate_bag] do
      dir = Path.join(tmp, "#{type}")
      # No two keys differ only in the sign of a zero: one key on both rules.
      objects = [{nz(), :neg}, {{:t, nz(), 1}, :x}, {{:t, 0.0, 2}, :y}, {1, :one}]
      write(dir, true, type, objects)
      keys = [0.0, nz(), {:t, nz(), 1}, {:t, 0.0, 1}, {:t, 0.0, 2}, 1]

      Heft.VM.with_zero_rule(false, fn ->
        {:ok, t} = Heft.open(dir)
        same_as_ets_under(t, type, objects, keys, false)
        # The moved keys are durable: they are where they should be after
        # a second open too, and inserting -0.0 again adds no second key.
        :ok = Heft.close(t)
        {:ok, t} = Heft.open(dir)
        if type != :duplicate_bag, do: Heft.insert(t, {nz(), :neg})
        same_as_ets_under(t, type, objects, keys, false)
        :ok = Heft.close(t)
      end)
    end
  end

  test "a table written where they are two opens where they are one", %{tmp_dir: tmp} do
    for type <- [:set, :bag, :duplicate_bag] do
      dir = Path.join(tmp, "#{type}")
      objects = [{nz(), :neg}, {{:t, nz()}, :x}, {1, :one}]
      write(dir, false, type, objects)
      keys = [0.0, nz(), {:t, nz()}, {:t, 0.0}, 1]

      Heft.VM.with_zero_rule(true, fn ->
        {:ok, t} = Heft.open(dir)
        same_as_ets_under(t, type, objects, keys, true)
        :ok = Heft.close(t)
      end)
    end
  end

  test "keys that would become one are refused, and the table is left as it was",
       %{tmp_dir: tmp} do
    # In a bag, objects of keys that become one stay apart unless they
    # become one object too.
    for {type, objects} <- [set: [{0.0, :pos}, {nz(), :neg}], bag: [{0.0, :x}, {nz(), :x}]] do
      dir = Path.join(tmp, "#{type}")
      write(dir, false, type, objects)

      Heft.VM.with_zero_rule(true, fn ->
        assert Heft.open(dir) == {:error, :zero_key_conflict}
      end)

      Heft.VM.with_zero_rule(false, fn ->
        {:ok, t} = Heft.open(dir)
        assert Enum.sort_by(Heft.tab2list(t), &exact/1) == Enum.sort_by(objects, &exact/1)
        :ok = Heft.close(t)
      end)
    end
  end

  # Compares with :ets where the VM's rule is the one played, else with
  # what ETS of that rule answers: each object alone under its own key.
  defp same_as_ets_under(t, type, objects, keys, merged) do
    if merged == (:erlang.list_to_float(~c"-0.0") === 0.0) do
      same_as_ets(t, type, objects, keys)
    else
      for o <- objects do
        assert exact(Heft.lookup(t, elem(o, 0))) == exact([o]), inspect(o)
      end

      assert Heft.info(t, :size) == length(objects)
    end
  end
end
