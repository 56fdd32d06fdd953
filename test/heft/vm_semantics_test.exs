defmodule Heft.VMSemanticsTest do
  # What ETS does differently from one OTP release to the next, and Heft
  # with it (Heft.VM learns each rule from the running VM's ETS): every test
  # runs the same calls on :ets and on Heft and expects the same answers,
  # whichever release runs it. bin/test runs them on OTP 25; bin/test-otp
  # 27 and 29 on the others.
  use ExUnit.Case, async: true

  # Runs `fun.(m, tab)` on a new table of each backend; asserts the same
  # answers (exceptions compared by module) and returns them.
  defp same(opts, fun) do
    ets = outcome(fn -> fun.(:ets, :ets.new(:vm, opts)) end)
    heft = outcome(fn -> fun.(Heft, Heft.new(:vm, opts)) end)
    assert heft == ets
    ets
  end

  defp outcome(fun) do
    {:ok, fun.()}
  rescue
    e -> {:raised, e.__struct__}
  end

  test "the facts learnt are the running VM's" do
    facts = Heft.VM.facts()
    release = :erlang.system_info(:otp_release) |> List.to_integer()
    assert facts.neg_zero_is_zero == release < 27
    assert facts.bag_batch_reversed == release < 27
    assert facts.map_key_is_pattern == release >= 27
    assert facts.heir_without_data == release >= 29
    assert facts.fold_end_of_table.hash == if(release < 27, do: :stop, else: :visit)
    assert facts.fold_end_of_table.ordered == if(release < 27, do: :stop, else: :raise)
  end

  test "a bag takes a list in the VM's order; a duplicate_bag in list order" do
    for type <- [:bag, :duplicate_bag] do
      {:ok, answers} =
        same([type], fn m, t ->
          m.insert(t, [{:k, 3}, {:k, 1}, {:j, 0}, {:k, 2}, {:k, 1}])
          first = m.lookup(t, :k)
          m.insert(t, [{:k, 5}, {:k, 4}, {:k, 3}])
          [first, m.lookup(t, :k), m.lookup(t, :j)]
        end)

      # Both orders are seen across releases; the answers are not trivial.
      assert length(hd(answers)) >= 3
    end
  end

  test "a map in a match pattern's key matches as the VM's ETS matches it" do
    objects = [{%{a: 1, b: 2}, 1}, {%{a: 1}, 2}, {{:t, %{a: 1, c: 3}}, 3}, {%{a: 2}, 4}]

    for type <- [:set, :ordered_set, :bag, :duplicate_bag] do
      same([type], fn m, t ->
        m.insert(t, objects)
        spec = [{{%{a: 1}, :"$1"}, [], [:"$1"]}]
        tuple_spec = [{{{:t, %{a: 1}}, :_}, [], [:"$_"]}]

        [
          Enum.sort(m.select(t, spec)),
          Enum.sort(m.select(t, tuple_spec)),
          m.select_count(t, [{{%{a: 1}, :_}, [], [true]}]),
          Enum.sort(m.match_object(t, {%{a: 1}, :_})),
          Enum.sort(m.match(t, {%{a: 1}, :"$1"})),
          m.select_delete(t, [{{%{a: 1}, :_}, [], [true]}]),
          Enum.sort(m.tab2list(t))
        ]
      end)
    end
  end

  test "foldl/3 and foldr/3 at the key :\"$end_of_table\" do what the VM's ETS does" do
    for type <- [:set, :bag, :ordered_set],
        objects <- [[{:"$end_of_table"}], [{1}, {:"$end_of_table"}, {:z}]] do
      same([type], fn m, t ->
        m.insert(t, objects)
        seen = fn o, acc -> [o | acc] end
        # A set's walk order is its own: compare what the walk saw as a set
        # where it runs to the end, and whether it stopped early.
        [Enum.sort(m.foldl(seen, [], t)), Enum.sort(m.foldr(seen, [], t))]
        |> Enum.map(fn saw ->
          if type == :ordered_set, do: saw, else: length(saw) == length(objects)
        end)
      end)
    end
  end

  test "an heir without data is taken where the VM's ETS takes one" do
    me = self()

    same([], fn m, t ->
      set =
        try do
          m.setopts(t, {:heir, me})
          {:set, m.info(t, :heir) == me}
        rescue
          ArgumentError -> :refused
        end

      made =
        try do
          m.new(:vm_heir, [{:heir, me}])
          :made
        rescue
          ArgumentError -> :refused
        end

      {set, made}
    end)
  end

  test "an heir without data takes the table without a transfer message" do
    if Heft.VM.fact(:heir_without_data) do
      me = self()

      {owner, ref} =
        spawn_monitor(fn ->
          t = Heft.new(:vm_heir, [:public, {:heir, me}])
          Heft.insert(t, {1, :one})
          send(me, {:table, t})
        end)

      assert_receive {:table, t}
      assert_receive {:DOWN, ^ref, :process, ^owner, _}
      assert Heft.lookup(t, 1) == [{1, :one}]
      assert Heft.info(t, :owner) == self()
      refute_received {:"HEFT-TRANSFER", _, _, _}
    end
  end
end
