defmodule Heft.Test.MatchSpecGen do
  # Random table contents and match specifications for the differential
  # test (test/heft/select_differential_test.exs). Uses the process's
  # :rand state, so a seed reproduces a run.
  #
  # Values come from a small domain on purpose, so that patterns and
  # guards often match: integers and floats that are == but not =:=
  # (1 and 1.0), atoms, binaries (a few long, compressible values among
  # them), small and nested tuples, lists of every
  # shape (empty, proper, improper, charlists that share prefixes such as
  # ~c"3", ~c"30", ~c"31"), and small maps. Heads hold the partly bound
  # shapes an ordered_set plans as a key range: lists with a bound head and
  # an open or improper tail (`[?3 | :"$1"]`, `[1, :_ | :b]`), nested
  # tuples, map patterns (which match larger maps). Specs mix `:_`,
  # `:"$N"` variables and literals in heads; guards use type tests,
  # comparisons (`==` and `=:=` pin keys, so the planner's lookups are
  # exercised), `andalso`/`orelse`/`not`; bodies are `:"$_"`, `:"$$"`,
  # variables, tuple constructions, `true` and arithmetic that may fail.
  # Some specs are invalid (a variable unbound in the head): ETS and Heft
  # must then both raise.
  @moduledoc false

  @atoms [:a, :b, :c]
  @scalars [0, 1, 2, 3, 1.0, 2.0, 0.5, :a, :b, :c, "x", "y", []]
  @charlists [~c"3", ~c"30", ~c"31", ~c"4", ~c"", [?3 | ?0], [?3 | :a], ~c"300"]
  @heads [?3, ?4, ?0, 1, 1.0, :a]
  @map_keys [:a, :b, 1]
  # Long, compressible values: a body holding one is compressed by every
  # codec, so the scan's tests run on decompressed bytes too.
  @bulky [
    :binary.copy("xy", 150),
    List.duplicate(:a, 120),
    List.duplicate({:t, 1}, 60),
    String.duplicate("x", 300)
  ]

  defp pick(list), do: Enum.at(list, :rand.uniform(length(list)) - 1)
  defp chance(p), do: :rand.uniform() < p

  @doc "A value of the domain, nested at most `depth` levels."
  def value(depth \\ 2) do
    cond do
      depth > 0 and chance(0.04) -> pick(@bulky)
      depth > 0 and chance(0.15) -> {:t, value(depth - 1)}
      depth > 0 and chance(0.1) -> {value(depth - 1), value(depth - 1)}
      depth > 0 and chance(0.05) -> [value(depth - 1), value(depth - 1)]
      depth > 0 and chance(0.06) -> list_value(depth - 1)
      depth > 0 and chance(0.05) -> map_value(depth - 1)
      chance(0.08) -> pick(@charlists)
      true -> pick(@scalars)
    end
  end

  # A list of 0 to 3 elements, proper or with an improper tail.
  defp list_value(depth) do
    elems =
      for _ <- 1..Enum.random(0..3)//1, do: if(chance(0.5), do: pick(@heads), else: value(depth))

    tail = if elems != [] and chance(0.25), do: pick([:a, 1, {:t, 0}, "x"]), else: []
    List.foldr(elems, tail, &[&1 | &2])
  end

  defp map_value(depth) do
    Map.new(Enum.take_random(@map_keys, :rand.uniform(3)), fn k -> {k, value(depth)} end)
  end

  @doc "`n` objects of arity keypos..keypos+3 (keys may repeat)."
  def objects(n, keypos) do
    for _ <- 1..n do
      arity = keypos + :rand.uniform(4) - 1
      List.to_tuple(for _ <- 1..arity, do: value())
    end
  end

  @doc "A match specification of 1 to 3 clauses for a table with `keypos`."
  def spec(keypos), do: for(_ <- 1..:rand.uniform(3), do: clause(keypos))

  @doc """
  A spec for select_replace that keeps the key: the head binds the key to
  a variable or literal and the body rebuilds the object around it.
  """
  def replace_spec(keypos) do
    for _ <- 1..:rand.uniform(2) do
      arity = keypos + :rand.uniform(3) - 1
      key = if chance(0.5), do: :"$1", else: pick(@scalars)

      head =
        for(i <- 1..arity, do: if(i == keypos, do: key, else: head_element(2)))
        |> List.to_tuple()

      vars = variables(head)

      body_elems =
        for i <- 1..(keypos + :rand.uniform(3) - 1) do
          if i == keypos, do: key, else: body_expr(vars)
        end

      body = if chance(0.2), do: :"$_", else: {List.to_tuple(body_elems)}
      {head, guards(vars), [body]}
    end
  end

  defp clause(keypos) do
    head =
      cond do
        chance(0.05) -> :_
        chance(0.05) -> :"$1"
        chance(0.03) -> pick(@atoms)
        true -> tuple_head(keypos)
      end

    vars = variables(head)
    # Now and then a variable the head does not bind: an invalid spec.
    vars = if chance(0.03), do: [:"$9" | vars], else: vars
    {head, guards(vars), body(vars)}
  end

  defp tuple_head(keypos) do
    arity = max(1, keypos + :rand.uniform(4) - 2)
    List.to_tuple(for _ <- 1..arity, do: head_element(2))
  end

  defp head_element(depth) do
    cond do
      chance(0.3) -> :_
      chance(0.35) -> :"$#{:rand.uniform(4)}"
      depth > 0 and chance(0.15) -> {:t, head_element(depth - 1)}
      depth > 0 and chance(0.05) -> [head_element(depth - 1), head_element(depth - 1)]
      depth > 0 and chance(0.08) -> list_pattern(depth - 1)
      depth > 0 and chance(0.05) -> {head_element(depth - 1), {:t, head_element(depth - 1)}}
      depth > 0 and chance(0.05) -> map_pattern(depth - 1)
      true -> value(1)
    end
  end

  # `[h1, ... | tail]` with bound or open elements and a tail that is
  # open (`:_`, a variable), `[]`, a further pattern or a non-list term.
  defp list_pattern(depth) do
    elems =
      for _ <- 1..:rand.uniform(2),
          do: if(chance(0.6), do: pick(@heads), else: head_element(depth))

    tail =
      cond do
        chance(0.35) -> :_
        chance(0.3) -> :"$#{:rand.uniform(4)}"
        chance(0.3) -> []
        chance(0.5) -> pick([:a, 1, ?0])
        true -> [head_element(depth) | :_]
      end

    List.foldr(elems, tail, &[&1 | &2])
  end

  # A map pattern matches maps with at least these keys.
  defp map_pattern(depth) do
    Map.new(Enum.take_random(@map_keys, :rand.uniform(2)), fn k -> {k, head_element(depth)} end)
  end

  defp variables(head) do
    head |> collect_vars([]) |> Enum.uniq() |> Enum.sort()
  end

  defp collect_vars(a, acc) when is_atom(a) do
    if String.starts_with?(Atom.to_string(a), "$"), do: [a | acc], else: acc
  end

  defp collect_vars(t, acc) when is_tuple(t), do: collect_vars(Tuple.to_list(t), acc)
  defp collect_vars([h | t], acc), do: collect_vars(t, collect_vars(h, acc))
  defp collect_vars(%{} = m, acc), do: collect_vars(Map.values(m), acc)
  defp collect_vars(_, acc), do: acc

  defp guards([]), do: []

  defp guards(vars) do
    for _ <- 1..Enum.random([0, 0, 1, 1, 2])//1, do: guard(vars, 2)
  end

  defp guard(vars, depth) do
    v = pick(vars)

    cond do
      depth > 0 and chance(0.12) -> {:andalso, guard(vars, depth - 1), guard(vars, depth - 1)}
      depth > 0 and chance(0.08) -> {:orelse, guard(vars, depth - 1), guard(vars, depth - 1)}
      depth > 0 and chance(0.05) -> {:not, guard(vars, depth - 1)}
      chance(0.25) -> {pick([:is_integer, :is_atom, :is_float, :is_tuple, :is_binary]), v}
      chance(0.3) -> {pick([:"=:=", :==]), v, constant()}
      chance(0.1) -> {pick([:"=:=", :"=/=", :==, :"/="]), v, pick(vars)}
      true -> {pick([:>, :<, :>=, :"=<", :"/=", :"=/="]), v, constant()}
    end
  end

  # A literal as a guard/body expression: tuples must be quoted.
  defp constant do
    case value(1) do
      t when is_tuple(t) -> {:const, t}
      [_ | _] = l -> {:const, l}
      other -> other
    end
  end

  defp body([]), do: [pick([:"$_", :"$$", true, {:const, :none}])]

  defp body(vars) do
    expr =
      cond do
        chance(0.2) -> :"$_"
        chance(0.15) -> :"$$"
        chance(0.15) -> true
        true -> body_expr(vars)
      end

    if chance(0.1), do: [body_expr(vars), expr], else: [expr]
  end

  defp body_expr([]), do: constant()

  defp body_expr(vars) do
    cond do
      chance(0.4) -> pick(vars)
      chance(0.3) -> {List.to_tuple(for _ <- 1..:rand.uniform(3), do: pick(vars))}
      chance(0.3) -> {:+, pick(vars), 1}
      chance(0.2) -> [pick(vars)]
      true -> constant()
    end
  end
end
