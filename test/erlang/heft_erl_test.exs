defmodule Heft.ErlangApiTest do
  # src/heft.erl is the Erlang face of Heft: one plain delegating function
  # per public function of Heft, same name, same arity.
  use ExUnit.Case, async: true

  @not_api [
    __info__: 1,
    __parse_options__: 1,
    __compression_shape__: 1,
    __ets_info_items__: 0,
    module_info: 0,
    module_info: 1
  ]

  defp exports(mod), do: MapSet.new(mod.module_info(:exports) -- @not_api)

  test "every public Heft function has a :heft twin, and :heft has nothing else" do
    heft = exports(Heft)
    erl = exports(:heft)
    assert MapSet.difference(heft, erl) |> Enum.sort() == [], "missing in src/heft.erl"
    assert MapSet.difference(erl, heft) |> Enum.sort() == [], "not in Heft"
  end

  test "each :heft function calls the Heft function of its own name and arity with its arguments" do
    {:ok, {:heft, [abstract_code: {:raw_abstract_v1, forms}]}} =
      :beam_lib.chunks(:code.which(:heft), [:abstract_code])

    functions = for {:function, _, name, arity, clauses} <- forms, do: {name, arity, clauses}
    assert length(functions) == MapSet.size(exports(:heft))

    for {name, arity, [{:clause, _, args, [], [body]}]} <- functions do
      vars = for {:var, _, v} <- args, do: v
      assert length(vars) == arity

      assert {:call, _, {:remote, _, {:atom, _, Heft}, {:atom, _, ^name}}, call_args} = body,
             "#{name}/#{arity} does not call Heft.#{name}"

      assert for({:var, _, v} <- call_args, do: v) == vars,
             "#{name}/#{arity} does not pass its arguments through in order"
    end
  end

  test "an Erlang program's round trip through :heft" do
    t = :heft.new(:erl_api_roundtrip, [:ordered_set, :public])
    assert :heft.insert(t, [{2, :b}, {1, :a}]) == true
    assert :heft.lookup(t, 1) == [{1, :a}]
    assert :heft.first(t) == 1
    assert {[{1, :a}], cont} = :heft.select(t, [{:_, [], [:"$_"]}], 1)
    assert {[{2, :b}], _} = :heft.select(cont)
    assert :heft.update_counter(t, 3, {2, 5}, {3, 0}) == 5
    assert :heft.info(t, :size) == 3
    assert :heft.safe_fixtable(t, true) == true
    assert :heft.info(t, :safe_fixed) != false
    assert :heft.slot(t, 0) == [{1, :a}]
    assert :heft.slot(t, 3) == :"$end_of_table"
    assert :heft.safe_fixtable(t, false) == true
    cont = :erlang.binary_to_term(:erlang.term_to_binary(cont))
    assert {[{2, :b}], _} = :heft.select(:heft.repair_continuation(cont, [{:_, [], [:"$_"]}]))
    assert :heft.delete(t) == true
  end

  test "bad input raises Heft's ArgumentError through :heft too" do
    assert_raise ArgumentError, fn -> :heft.new("not an atom", []) end
  end
end
