defmodule Heft.MatchSpec do
  # Match specifications, read on the Elixir side. Heft runs them with the
  # VM's own matcher (:ets.match_spec_compile/1 and :ets.match_spec_run/2)
  # on decoded records, so results are ETS's by construction; this module
  # only reads specs to decide how to feed the matcher:
  #
  # - compile!/1: validation (ArgumentError for what ETS rejects with badarg).
  # - plan/2: the keys a spec can match, so that select looks them up
  #   instead of scanning: `{:lookup, keys}` or `:scan`.
  # - keeps_key?/2: ETS's static check that a select_replace spec cannot
  #   change an object's key (erl_db_util.c, db_match_keeps_key).
  # - with_object/1: a spec whose results are `{result, object}`, so that
  #   select_delete and select_replace know which object each came from.
  @moduledoc false

  @typedoc "A match specification, as for :ets.select/2."
  @type t :: [{term, [term], [term]}]

  @doc false
  # The compiled spec, or `nil` for `[]` (which :ets.match_spec_compile/1
  # rejects but every ETS select function accepts, matching nothing).
  # Raises ArgumentError, as ETS raises badarg, for an invalid spec.
  @spec compile!(term) :: :ets.compiled_match_spec() | nil
  def compile!([]), do: nil

  def compile!(spec) do
    :ets.match_spec_compile(spec)
  rescue
    ArgumentError -> invalid!(spec)
  end

  @doc false
  @spec invalid!(term) :: no_return
  def invalid!(spec) do
    raise ArgumentError, "not a valid match specification: " <> inspect(spec, limit: 12)
  end

  @doc false
  # Runs a compiled spec over objects; `nil` (the empty spec) matches none.
  @spec run([tuple], reference | nil) :: [term]
  def run(_objects, nil), do: []
  def run([], _ms), do: []
  def run(objects, ms), do: :ets.match_spec_run(objects, ms)

  @doc false
  # `[{pattern, [], [:"$$"]}]`, `[{pattern, [], [:"$_"]}]`, `[{pattern, [], [true]}]`:
  # the specs behind match/2, match_object/2 and match_delete/2.
  @spec of_pattern(term, :bindings | :object | true) :: t
  def of_pattern(pattern, :bindings), do: [{pattern, [], [:"$$"]}]
  def of_pattern(pattern, :object), do: [{pattern, [], [:"$_"]}]
  def of_pattern(pattern, true), do: [{pattern, [], [true]}]

  @doc false
  # True for a spec whose first clause matches every object and returns
  # `true`: select_count of it is the table's size.
  @spec counts_all?(t) :: boolean
  def counts_all?([{head, [], [true]} | _]), do: head == :_ or variable?(head)
  def counts_all?(_spec), do: false

  @doc false
  # What select_delete can delete without decoding the objects: `:all` when
  # the spec matches every object with the result `true`, `{:arity, n}`
  # when it matches exactly the n-tuples (`[{{_, ..., _}, [], [true]}]`,
  # each element `:_` or a variable of its own: match_delete(t, {_, _})),
  # else nil. The spec must be valid.
  @spec deletes_by_shape(t) :: :all | {:arity, non_neg_integer} | nil
  def deletes_by_shape(spec) do
    case spec do
      _ when spec != [] ->
        if counts_all?(spec), do: :all, else: arity_only(spec)

      _ ->
        nil
    end
  end

  defp arity_only([{head, [], [true]}]) when is_tuple(head) do
    elems = Tuple.to_list(head)
    vars = Enum.filter(elems, &variable?/1)

    if Enum.all?(elems, &(&1 == :_ or variable?(&1))) and vars == Enum.uniq(vars),
      do: {:arity, tuple_size(head)}
  end

  defp arity_only(_spec), do: nil

  @doc false
  # The same spec with each clause's result `r` replaced by `{r, object}`
  # (`{{r, :"$_"}}`). Body expressions before the last are kept: they
  # cannot change the result but an error in them still fails the clause
  # as it does in ETS. The spec must be valid.
  @spec with_object(t) :: t
  def with_object(spec) do
    for {head, guards, body} <- spec do
      {init, [last]} = Enum.split(body, -1)
      {head, guards, init ++ [{{last, :"$_"}}]}
    end
  end

  ## Planning

  # Cartesian products of candidate keys larger than this give up (scan).
  @max_keys 64

  # Stands for any term in a range bound (order::compare_bound).
  @wild :"$heft_wildcard"

  @doc false
  # How select finds what a (valid) spec can match in a table whose key is
  # element `keypos`: `{:lookup, keys}`, `{:range, lo, hi}` (an ordered_set,
  # `ordered` true) or `:scan`. The spec still runs on every object found,
  # so a plan must hold every object ETS would run the spec on and, for
  # one quirk of ETS (below), no other.
  #
  # ETS reads each clause's key element (analyze_pattern and key_given in
  # erl_db_hash.c and erl_db_tree.c):
  #
  # - no `:_` or `:"$N"` in it (map values included): a *bound* key,
  #   looked up by key equality, not matched, so that a map in it finds
  #   only a key equal to it, not the larger maps its pattern matches
  #   (OTP 26 and older; from OTP 27 a key holding a map is never bound,
  #   Heft.VM's map_key_is_pattern);
  # - in an ordered_set, a *partly bound* key, with a variable inside and
  #   no map (`{:user, :_}`, `[?3 | :"$1"]`): its keys are one run of the
  #   term order (order::compare_bound);
  # - anything else (a variable, a map with a variable, a head that is a
  #   variable): the whole table.
  #
  # When every clause is bound (or, in an ordered_set, bound or partly
  # bound), ETS looks only there: an ordered_set walks from the smallest
  # of those keys to the greatest (OTP 25: whether the bound keys are in
  # the table or not; one key alone is looked up), running the whole spec
  # on every object in between. Where a bound key holds a map, a map pattern of the spec
  # then matches larger maps inside that walk and not outside it, so Heft
  # walks exactly that range (limited/3). When ETS walks the whole table,
  # Heft narrows the walk to what the clauses can match (widened/3).
  @spec plan(t, pos_integer, boolean) :: :scan | {:lookup, [term]} | {:range, bound, bound}
  def plan(spec, keypos, ordered \\ false) do
    kinds = Enum.map(spec, &kind(&1, keypos, ordered))

    if :unlimited in kinds,
      do: widened(spec, keypos, ordered),
      else: limited(kinds, ordered)
  end

  # How ETS classes a clause: :none (it can match no object),
  # {:bound, key}, {:partial, key} or :unlimited.
  defp kind({head, _guards, _body}, keypos, ordered) do
    map_pattern? = Heft.VM.fact(:map_key_is_pattern)

    cond do
      head == :_ or variable?(head) ->
        :unlimited

      is_tuple(head) and tuple_size(head) >= keypos ->
        key = elem(head, keypos - 1)

        cond do
          # A bound holding the planner's own wildcard atom: no range.
          mentions_wild?(key) -> :unlimited
          not has_variable?(key) and not (map_pattern? and has_map?(key)) -> {:bound, key}
          ordered and not variable?(key) and key != :_ and not has_map?(key) -> {:partial, key}
          true -> :unlimited
        end

      true ->
        :none
    end
  end

  defp limited([{:bound, key}], _ordered), do: {:lookup, [key]}

  defp limited(kinds, false) do
    {:lookup, Enum.uniq(for {:bound, key} <- kinds, do: key)}
  end

  defp limited(kinds, true) do
    case ets_range(kinds) do
      {:quirk, range} -> range
      _ -> ordered_plan(kinds)
    end
  end

  defp ordered_plan(kinds) do
    bound = for {:bound, key} <- kinds, do: key
    partial = for {:partial, key} <- kinds, do: key

    cond do
      # Without maps, a bound key's clause matches that key only: the
      # lookups find what ETS's walk between them would match.
      partial == [] and not Enum.any?(bound, &has_map?/1) ->
        {:lookup, bound |> Enum.sort() |> dedup_equal()}

      partial == [] and Enum.all?(bound, &(&1 == hd(bound))) ->
        {:lookup, [hd(bound)]}

      true ->
        hull(Enum.map(bound, &run({:bound, &1})) ++ Enum.map(partial, &run({:partial, &1})))
    end
  end

  # What an ordered_set's ETS walks for clauses that are all bound or
  # partly bound: from the clause key that "can match lesser" than the
  # others to the one that "can match greater" (ets_end/2). That is the
  # range in term order of what they match (`:exact`), except where
  # ETS's comparison is not term order (can_match/3): then
  # `{:quirk, plan}`, the range ETS walks (or, every clause bound and
  # both ends `==`, the one key it looks up), which misses matches the
  # term order would find; a select/3 continuation walks on past its end
  # (overruns?/2), as ETS's does.
  defp ets_range(kinds) do
    keys = for {kind, _} = k <- kinds, kind in [:bound, :partial], do: k

    with [_, _ | _] <- keys,
         {least, most} = {ets_end(keys, :lt), ets_end(keys, :gt)},
         ets = {:range, elem(run(least), 0), elem(run(most), 1)},
         false <- ets === hull(Enum.map(keys, &run/1)) do
      all_bound = Enum.all?(keys, &match?({:bound, _}, &1))

      if all_bound and elem(least, 1) == elem(most, 1),
        do: {:quirk, {:lookup, [elem(least, 1)]}},
        else: {:quirk, ets}
    else
      _ -> :exact
    end
  end

  # The run of keys a bound or partly bound key stands for.
  defp run({:bound, key}), do: {{key, true}, {key, true}}

  defp run({:partial, key}) do
    {:bound, b} = prefix(key)
    {{b, true}, {b, true}}
  end

  # The clause key ETS walks from (`:lt`) or to (`:gt`): analyze_pattern
  # in erl_db_tree.c takes the first clause's, then each later one that
  # "can match lesser" (greater) than it.
  defp ets_end([first | rest], dir) do
    Enum.reduce(rest, first, fn {_, key} = k, {_, at} = acc ->
      if can_match(key, at, dir) == :yes, do: k, else: acc
    end)
  end

  # ETS's do_partly_bound_can_match_lesser (`:lt`) and _greater (`:gt`),
  # step for step: `:yes`, `:no`, or `:cont` (undecided here: the caller
  # goes on with the next element). Not term order: two numbers of
  # different types (an integer and a float) that are `==` decide `:no`
  # (ETS compares terms of different tags once, and stops), so of the
  # clause keys `[1, 0]` and `[1.0 | :"$3"]` ETS walks to `[1, 0]`, and
  # never reaches `[1.0, 2]`, which the second matches. A tuple of more
  # (`:lt`) or fewer (`:gt`) elements is undecided too.
  defp can_match(a, b, dir) do
    cond do
      unbound?(a) ->
        if unbound?(b), do: :no, else: :yes

      unbound?(b) ->
        :no

      a === b ->
        :cont

      is_tuple(a) and is_tuple(b) and tuple_size(a) != tuple_size(b) ->
        if tuple_size(a) < tuple_size(b) == (dir == :lt), do: :yes, else: :cont

      is_tuple(a) and is_tuple(b) ->
        first_decided(Tuple.to_list(a), Tuple.to_list(b), &can_match(&1, &2, dir), :cont)

      match?([_ | _], a) and match?([_ | _], b) ->
        can_match_list(a, b, dir)

      is_number(a) and is_number(b) and is_float(a) != is_float(b) and a == b ->
        :no

      a == b ->
        :cont

      a < b == (dir == :lt) ->
        :yes

      true ->
        :no
    end
  end

  defp can_match_list([a | as], [b | bs], dir) do
    case can_match(a, b, dir) do
      :cont when as === bs ->
        :cont

      :cont when is_list(as) and as != [] and is_list(bs) and bs != [] ->
        can_match_list(as, bs, dir)

      :cont ->
        can_match(as, bs, dir)

      decided ->
        decided
    end
  end

  defp unbound?(a), do: is_atom(a) and (a == :_ or variable?(a))

  # ETS walks the whole table: Heft looks up the keys guards pin, or walks
  # the range that holds every clause's matches.
  #
  # A clause's keys come from its head's key element, with variables
  # resolved by guards that pin them: a top-level guard (or a conjunct of
  # `andalso`/`and` in one) `{:"=:=", var, c}` or `{:==, var, c}` where `c`
  # is a constant expression (`{:const, term}`, a literal, `{{...}}` of
  # constants). `==` pins a number to each number equal to it (1 and 1.0).
  # A map anywhere in the key pattern means no keys: ETS matches it here,
  # and a map pattern matches larger maps.
  #
  # In an ordered_set the keys come in term order, without two that are
  # `==` (the table's same key); a spec that pins no keys may still have
  # a range (range/2), else `:scan`.
  defp widened(spec, keypos, ordered) do
    Enum.reduce_while(spec, [], fn {head, guards, _body}, acc ->
      case clause_keys(head, guards, keypos) do
        :any -> {:halt, :scan}
        keys -> {:cont, [keys | acc]}
      end
    end)
    |> case do
      :scan when ordered -> range(spec, keypos)
      :scan -> :scan
      keys when ordered -> {:lookup, keys |> Enum.concat() |> Enum.sort() |> dedup_equal()}
      keys -> {:lookup, keys |> Enum.reverse() |> Enum.concat() |> Enum.uniq()}
    end
  end

  defp dedup_equal([a, b | rest]) when a == b, do: dedup_equal([a | rest])
  defp dedup_equal([a | rest]), do: [a | dedup_equal(rest)]
  defp dedup_equal([]), do: []

  # ETS's db_has_variable: `:_` or a variable anywhere, in tuples, list
  # cells and tails, and map values.
  defp has_variable?(a) when is_atom(a), do: a == :_ or variable?(a)
  defp has_variable?(t) when is_tuple(t), do: has_variable?(Tuple.to_list(t))
  defp has_variable?([h | t]), do: has_variable?(h) or has_variable?(t)
  defp has_variable?(%{} = m), do: has_variable?(Map.values(m))
  defp has_variable?(_), do: false

  defp has_map?(%{}), do: true
  defp has_map?(t) when is_tuple(t), do: has_map?(Tuple.to_list(t))
  defp has_map?([h | t]), do: has_map?(h) or has_map?(t)
  defp has_map?(_), do: false

  defp mentions_wild?(a) when is_atom(a), do: a == @wild
  defp mentions_wild?(t) when is_tuple(t), do: mentions_wild?(Tuple.to_list(t))
  defp mentions_wild?([h | t]), do: mentions_wild?(h) or mentions_wild?(t)
  defp mentions_wild?(%{} = m), do: mentions_wild?(Map.to_list(m))
  defp mentions_wild?(_), do: false

  ## Key ranges (ordered_set)

  @typedoc """
  One end of a key range: `nil` (unbounded) or `{bound, inclusive?}`,
  where `bound` is a key in which the atom `:"$heft_wildcard"` stands for
  any term from there on (heft_core's order::compare_bound).
  """
  @type bound :: nil | {term, boolean}

  # The range holding every clause's matches, else :scan. A clause's range
  # comes from its head's key element:
  #
  # - a key with no variable in it: itself (its map patterns, if any, as
  #   for a partly bound key);
  # - a partly bound key, `{:user, :_}` or `[:a | :"$1"]`: the keys that
  #   begin as it does, `{:user, wildcard}` at both ends. The key up to
  #   its first unbound part (a variable, `:_`, or a map, since map
  #   patterns match larger maps) is bound;
  # - a variable: the bounds its top-level guard conjuncts put on it,
  #   `{:>, :"$1", c}`, `{:"=<", c, :"$1"}` and so on with constant `c`
  #   (the tightest of each end). Term order is what both guards and the
  #   table use, so the range holds exactly the keys the guards let by.
  defp range(spec, keypos) do
    spec |> Enum.map(&clause_range(&1, keypos)) |> Enum.reject(&(&1 == :none)) |> hull()
  end

  # The smallest range holding all of `ranges`; :scan for the whole table.
  defp hull([]), do: {:lookup, []}

  defp hull([first | rest]) do
    case Enum.reduce(rest, first, fn {lo, hi}, {lo0, hi0} ->
           {wider(lo0, lo, :lo), wider(hi0, hi, :hi)}
         end) do
      {nil, nil} -> :scan
      {lo, hi} -> {:range, lo, hi}
    end
  end

  # The wider of two lower (`:lo`) or upper (`:hi`) ends.
  defp wider(nil, _b, _end), do: nil
  defp wider(_a, nil, _end), do: nil

  defp wider({x, xi} = a, {_y, yi} = b, end_) do
    case compare_ends(x, elem(b, 0), end_) do
      o when o in [:eq, :stop] -> {x, xi or yi}
      :lt when end_ == :lo -> a
      :gt when end_ == :hi -> a
      _ -> b
    end
  end

  # Two ends in term order, a wildcard standing for the smallest term
  # (`:lo`) or the greatest (`:hi`) from there: :lt, :gt, :eq, or :stop
  # when both are equal up to a wildcard at the same place (what follows
  # belongs to neither bound). Tuples by size then elements, lists head
  # then tail, as order::compare_bound walks them.
  defp compare_ends(a, b, end_) do
    cond do
      a === @wild and b === @wild ->
        :stop

      a === @wild ->
        if end_ == :lo, do: :lt, else: :gt

      b === @wild ->
        if end_ == :lo, do: :gt, else: :lt

      is_tuple(a) and is_tuple(b) and tuple_size(a) == tuple_size(b) ->
        first_decided(Tuple.to_list(a), Tuple.to_list(b), &compare_ends(&1, &2, end_), :eq)

      match?([_ | _], a) and match?([_ | _], b) ->
        first_decided([hd(a), tl(a)], [hd(b), tl(b)], &compare_ends(&1, &2, end_), :eq)

      a == b ->
        :eq

      a < b ->
        :lt

      true ->
        :gt
    end
  end

  @doc false
  # `key` against a range bound whose wildcard stands for any term from
  # there (order::compare_bound, ETS's cmp_partly_bound): :lt, :eq or :gt.
  @spec compare_bound(term, term) :: :lt | :eq | :gt
  def compare_bound(_key, @wild), do: :eq

  def compare_bound(key, bound)
      when is_tuple(key) and is_tuple(bound) and tuple_size(key) == tuple_size(bound),
      do: compare_bound(Tuple.to_list(key), Tuple.to_list(bound))

  def compare_bound([k | ks], [b | bs]) do
    case compare_bound(k, b) do
      :eq -> compare_bound(ks, bs)
      other -> other
    end
  end

  def compare_bound(key, bound) do
    cond do
      key == bound -> :eq
      key < bound -> :lt
      true -> :gt
    end
  end

  @doc false
  # Whether ETS, walking an ordered_set for `spec` (a `{:range, lo, hi}`
  # plan), can find matches past the range's end: a clause's bound key
  # holds a map, which matches larger maps (OTP 26 and older), or ETS's
  # range missed matches (ets_range/1; Heft.Select's overrun).
  @spec overruns?(t, pos_integer) :: boolean
  def overruns?(spec, keypos) do
    kinds = Enum.map(spec, &kind(&1, keypos, true))

    :unlimited not in kinds and
      (match?({:quirk, {:range, _, _}}, ets_range(kinds)) or
         Enum.any?(kinds, fn
           {:bound, key} -> has_map?(key)
           _ -> false
         end))
  end

  # The first answer of `fun` on the pairs of `xs` and `ys` (elements in
  # order) that is not `undecided`; `undecided` if every one is.
  defp first_decided([x | xs], [y | ys], fun, undecided) do
    case fun.(x, y) do
      ^undecided -> first_decided(xs, ys, fun, undecided)
      decided -> decided
    end
  end

  defp first_decided([], [], _fun, undecided), do: undecided

  defp clause_range({head, guards, _body}, keypos)
       when is_tuple(head) and tuple_size(head) >= keypos do
    key = elem(head, keypos - 1)

    if variable?(key) do
      guards
      |> Enum.flat_map(&conjuncts/1)
      |> Enum.reduce({nil, nil}, &narrow(&1, key, &2))
    else
      case prefix(key) do
        {:bound, bound} -> {{bound, true}, {bound, true}}
        :any -> {nil, nil}
      end
    end
  end

  defp clause_range({head, _guards, _body}, _keypos) do
    if head == :_ or variable?(head), do: {nil, nil}, else: :none
  end

  # `{:bound, b}` with everything from the first unbound part replaced by
  # the wildcard, or :any when the key is unbound from its start.
  defp prefix(key) do
    case prefix_of(key) do
      {:done, @wild} -> :any
      {_, bound} -> {:bound, bound}
    end
  end

  # {:done | :more, term}: :done once a wildcard was put in (what follows
  # does not count, and is a wildcard too). Atoms that begin with `$` but
  # are not variables are literals to ETS; the planner's own wildcard atom
  # can only stand for itself here.
  defp prefix_of(%{}), do: {:done, @wild}

  defp prefix_of(a) when is_atom(a) do
    if a == :_ or a == @wild or variable?(a), do: {:done, @wild}, else: {:more, a}
  end

  defp prefix_of(t) when is_tuple(t) do
    {state, list} = prefix_of_list(Tuple.to_list(t))
    {state, List.to_tuple(list)}
  end

  defp prefix_of([_ | _] = l), do: prefix_of_list(l)
  defp prefix_of(literal), do: {:more, literal}

  # Elements (and an improper tail) up to the first wildcard; the rest is
  # never compared: wildcards (a tuple's arity counts).
  defp prefix_of_list([h | t]) do
    case prefix_of(h) do
      {:done, b} -> {:done, [b | wilds(t)]}
      {:more, b} -> t |> prefix_of_tail() |> then(fn {s, rest} -> {s, [b | rest]} end)
    end
  end

  defp prefix_of_list([]), do: {:more, []}

  defp wilds([_ | t]), do: [@wild | wilds(t)]
  defp wilds([]), do: []
  defp wilds(_tail), do: @wild

  defp prefix_of_tail(t) when is_list(t), do: prefix_of_list(t)
  defp prefix_of_tail(t), do: prefix_of(t)

  # The range {lo, hi} narrowed by one guard conjunct on `var`.
  defp narrow({op, a, b}, var, range) when op in [:<, :>, :"=<", :>=, :==, :"=:="] do
    cond do
      a == var and not mentions_dollar?(b) -> narrow_by(op, constant(b), range)
      b == var and not mentions_dollar?(a) -> narrow_by(flip(op), constant(a), range)
      true -> range
    end
  end

  defp narrow(_guard, _var, range), do: range

  defp flip(:<), do: :>
  defp flip(:>), do: :<
  defp flip(:"=<"), do: :>=
  defp flip(:>=), do: :"=<"
  defp flip(op), do: op

  defp narrow_by(_op, :error, range), do: range
  defp narrow_by(:<, {:ok, c}, {lo, hi}), do: {lo, tighter(hi, {c, false}, :hi)}
  defp narrow_by(:"=<", {:ok, c}, {lo, hi}), do: {lo, tighter(hi, {c, true}, :hi)}
  defp narrow_by(:>, {:ok, c}, {lo, hi}), do: {tighter(lo, {c, false}, :lo), hi}
  defp narrow_by(:>=, {:ok, c}, {lo, hi}), do: {tighter(lo, {c, true}, :lo), hi}

  defp narrow_by(_eq, {:ok, c}, {lo, hi}),
    do: {tighter(lo, {c, true}, :lo), tighter(hi, {c, true}, :hi)}

  # The tighter of two lower (`:lo`: the greater) or upper (`:hi`: the
  # smaller) ends; an exclusive one where the terms are equal.
  defp tighter(nil, new, _end), do: new
  defp tighter({x, xi}, {y, yi}, _end) when x == y, do: {x, xi and yi}
  defp tighter({x, _}, {y, _} = new, :lo) when y > x, do: new
  defp tighter({x, _}, {y, _} = new, :hi) when y < x, do: new
  defp tighter(old, _new, _end), do: old

  defp clause_keys(head, guards, keypos) do
    cond do
      head == :_ or dollar?(head) ->
        :any

      is_tuple(head) and tuple_size(head) >= keypos ->
        pins = guards |> Enum.flat_map(&conjuncts/1) |> pins()
        instances(elem(head, keypos - 1), pins)

      true ->
        []
    end
  end

  defp conjuncts({op, a, b}) when op in [:andalso, :and], do: conjuncts(a) ++ conjuncts(b)
  defp conjuncts(guard), do: [guard]

  # %{var => [candidate values]}: each pinned variable's possible values.
  defp pins(guards) do
    Enum.reduce(guards, %{}, fn guard, acc ->
      case pin(guard) do
        {var, values} -> Map.update(acc, var, values, &intersect(&1, values))
        nil -> acc
      end
    end)
  end

  defp pin({op, a, b}) when op in [:"=:=", :==] do
    cond do
      variable?(a) -> pin(op, a, b)
      variable?(b) -> pin(op, b, a)
      true -> nil
    end
  end

  defp pin(_guard), do: nil

  defp pin(op, var, expr) do
    with {:ok, value} <- constant(expr),
         values when is_list(values) <- if(op == :==, do: equal_terms(value), else: [value]) do
      {var, values}
    else
      _ -> nil
    end
  end

  defp intersect(xs, ys), do: Enum.filter(xs, fn x -> Enum.any?(ys, &(&1 === x)) end)

  # The value of a guard expression without variables, computed by the VM
  # itself (so every guard function and constructor means what it means to
  # ETS); :error when it has variables or fails. Numbers, binaries and
  # plain atoms stand for themselves.
  defp constant(expr) when is_number(expr) or is_binary(expr), do: {:ok, expr}

  defp constant(expr) when is_atom(expr) and expr != :_ do
    if dollar?(expr), do: :error, else: {:ok, expr}
  end

  defp constant(expr) do
    if mentions_dollar?(expr) do
      :error
    else
      case :ets.match_spec_run([{}], :ets.match_spec_compile([{:_, [], [expr]}])) do
        [value] when value != :EXIT -> {:ok, value}
        _ -> :error
      end
    end
  rescue
    ArgumentError -> :error
  end

  defp mentions_dollar?(a) when is_atom(a), do: a == :_ or dollar?(a)
  defp mentions_dollar?(t) when is_tuple(t), do: mentions_dollar?(Tuple.to_list(t))
  defp mentions_dollar?([h | t]), do: mentions_dollar?(h) or mentions_dollar?(t)
  defp mentions_dollar?(%{} = m), do: mentions_dollar?(Map.to_list(m))
  defp mentions_dollar?(_), do: false

  # Every term `==` to `value` that is not `=:=` to it differs only in
  # numbers: 1 and 1.0 (and 0.0 and -0.0 where they are different keys).
  # nil when there are too many, or a map holds a number.
  defp equal_terms(value) do
    case variants(value) do
      vs when is_list(vs) and length(vs) <= @max_keys -> vs
      _ -> nil
    end
  end

  defp variants(n) when is_number(n), do: number_variants(n)

  defp variants(t) when is_tuple(t),
    do: t |> Tuple.to_list() |> variants() |> map_ok(&List.to_tuple/1)

  defp variants([h | t]), do: product(variants(h), variants(t), &[&1 | &2])

  defp variants(%{} = m) do
    if mentions_number?(m), do: nil, else: [m]
  end

  defp variants(other), do: [other]

  defp map_ok(nil, _fun), do: nil
  defp map_ok(list, fun), do: Enum.map(list, fun)

  defp product(nil, _, _), do: nil
  defp product(_, nil, _), do: nil

  defp product(xs, ys, fun) do
    if length(xs) * length(ys) > @max_keys, do: nil, else: for(x <- xs, y <- ys, do: fun.(x, y))
  end

  defp mentions_number?(n) when is_number(n), do: true
  defp mentions_number?(t) when is_tuple(t), do: mentions_number?(Tuple.to_list(t))
  defp mentions_number?([h | t]), do: mentions_number?(h) or mentions_number?(t)
  defp mentions_number?(%{} = m), do: mentions_number?(Map.to_list(m))
  defp mentions_number?(_), do: false

  defp number_variants(n) do
    float =
      try do
        n * 1.0
      rescue
        ArithmeticError -> nil
      end

    int = if is_float(n) and n == trunc(n), do: trunc(n)
    zeros = if n == 0, do: [0.0, :erlang.list_to_float(~c"-0.0")], else: []

    ([n, float, int] ++ zeros)
    |> Enum.filter(&(&1 != nil and &1 == n))
    |> Enum.uniq()
  end

  # The keys a key pattern can match given the pinned variables, or :any.
  defp instances(:_, _pins), do: :any

  defp instances(a, pins) when is_atom(a) do
    cond do
      variable?(a) -> Map.get(pins, a, :any)
      dollar?(a) -> :any
      true -> [a]
    end
  end

  defp instances(t, pins) when is_tuple(t) do
    case instances(Tuple.to_list(t), pins) do
      :any -> :any
      lists -> Enum.map(lists, &List.to_tuple/1)
    end
  end

  defp instances([h | t], pins) do
    with hs when is_list(hs) <- instances(h, pins),
         ts when is_list(ts) <- instances(t, pins),
         true <- length(hs) * length(ts) <= @max_keys do
      for x <- hs, y <- ts, do: [x | y]
    else
      _ -> :any
    end
  end

  defp instances(%{}, _pins), do: :any
  defp instances(literal, _pins), do: [literal]

  # A match variable `:"$N"`. Any other atom starting with `$` is treated
  # as unknown by the planner (never as a literal), which is always safe.
  # `:"$N"`, N a decimal number without leading zeros. (Without a regex:
  # a select asks this of every atom in its spec, and re:run was a tenth
  # of a small select's time.)
  defp variable?(a) when is_atom(a) do
    case Atom.to_string(a) do
      "$0" -> true
      "$" <> <<d, rest::binary>> when d in ?1..?9 -> digits?(rest)
      _ -> false
    end
  end

  defp variable?(_), do: false

  defp digits?(<<d, rest::binary>>) when d in ?0..?9, do: digits?(rest)
  defp digits?(<<>>), do: true
  defp digits?(_), do: false

  defp dollar?(a) when is_atom(a), do: String.starts_with?(Atom.to_string(a), "$")
  defp dollar?(_), do: false

  ## Sieve

  @doc false
  # What a scan can test on stored records before decoding them
  # (native/heft_nif/src/sieve.rs has the form): for each clause, the
  # shape and literals its head demands on the way down nested tuples, the
  # variables it repeats, and the comparisons and type tests of its guards
  # (top-level, or inside `andalso`/`and`) between such a variable and a
  # constant. nil when some clause can match any object. A sieve may keep
  # an object the spec does not match (the spec still runs on what it
  # keeps), never drop one it matches: whatever is not understood here
  # (lists, maps, other guards, variables bound inside them) adds no test.
  @spec sieve(t, pos_integer) :: nil | [[tuple]]
  def sieve(spec, _keypos) do
    clauses = for clause <- spec, (tests = clause_tests(clause)) != :never, do: tests

    if Enum.any?(clauses, &(&1 == :all or match?({[], _}, &1))),
      do: nil,
      else: Enum.map(clauses, &elem(&1, 0))
  end

  @doc false
  # Whether `sieve/2` states `spec` whole: every clause's body is `true`,
  # its head a tuple of variables, `:_`, scalar literals (atoms, numbers,
  # binaries, `[]`) and such tuples, and each of its guards a conjunction
  # of tests `sieve/2` makes (comparisons of a head variable with a scalar
  # constant, `=:=` of two head variables, type tests). Then a record the
  # sieve finds matching for certain (heft_core's sieve.rs, `judge`) is
  # one the spec returns `true` for.
  @spec exact?(t) :: boolean
  def exact?(spec) do
    spec != [] and
      Enum.all?(spec, fn
        {_head, _guards, [true]} = clause -> match?({_tests, true}, clause_tests(clause))
        _ -> false
      end)
  end

  # :all (the head matches any object), :never (no tuple), or
  # {tests, exact}: `exact` when the tests say all the head and guards say.
  defp clause_tests({head, guards, _body}) do
    cond do
      head == :_ or variable?(head) ->
        :all

      not is_tuple(head) ->
        :never

      true ->
        {tests, vars, exact} = head_tests(head, [], %{})

        Enum.reduce(guards, {tests, exact}, fn guard, {tests, exact} ->
          {more, whole} = guard_tests(guard, vars)
          {tests ++ more, exact and whole}
        end)
    end
  end

  # {tests, vars, exact}: `vars` maps a variable to the path of its first
  # place; `exact` when the tests say all the pattern says.
  defp head_tests(:_, _path, vars), do: {[], vars, true}

  defp head_tests(t, path, vars) when is_tuple(t) do
    t
    |> Tuple.to_list()
    |> Enum.with_index()
    |> Enum.reduce({[{:arity, path, tuple_size(t)}], vars, true}, fn {e, i},
                                                                     {tests, vars, exact} ->
      {more, vars, whole} = head_tests(e, path ++ [i], vars)
      {tests ++ more, vars, exact and whole}
    end)
  end

  defp head_tests(a, path, vars) when is_atom(a) do
    cond do
      variable?(a) and Map.has_key?(vars, a) -> {[{:same, path, vars[a]}], vars, true}
      variable?(a) -> {[], Map.put(vars, a, path), true}
      dollar?(a) -> {[], vars, false}
      true -> {[{:cmp, path, :"=:=", a}], vars, true}
    end
  end

  defp head_tests(x, path, vars) when is_number(x) or is_binary(x) or x == [],
    do: {[{:cmp, path, :"=:=", x}], vars, true}

  defp head_tests(_other, _path, vars), do: {[], vars, false}

  @comparisons [:<, :"=<", :>, :>=, :==, :"/=", :"=:=", :"=/="]
  @flipped %{:< => :>, :"=<" => :>=, :> => :<, :>= => :"=<"}
  @types %{
    is_integer: :integer,
    is_float: :float,
    is_number: :number,
    is_atom: :atom,
    is_binary: :binary,
    is_tuple: :tuple,
    is_list: :list,
    is_map: :map
  }

  # {tests, exact}: `exact` when the tests say all the guard says.
  defp guard_tests(true, _vars), do: {[], true}

  defp guard_tests({op, a, b}, vars) when op in [:andalso, :and] do
    {left, l} = guard_tests(a, vars)
    {right, r} = guard_tests(b, vars)
    {left ++ right, l and r}
  end

  defp guard_tests({op, a, b}, vars) when op in @comparisons do
    case {operand(a, vars), operand(b, vars)} do
      {{:path, p}, {:const, c}} -> {[{:cmp, p, op, c}], true}
      {{:const, c}, {:path, p}} -> {[{:cmp, p, Map.get(@flipped, op, op), c}], true}
      {{:path, p}, {:path, q}} when op == :"=:=" -> {[{:same, p, q}], true}
      _ -> {[], false}
    end
  end

  defp guard_tests({test, a}, vars) when is_map_key(@types, test) do
    case operand(a, vars) do
      {:path, p} -> {[{:is, p, @types[test]}], true}
      _ -> {[], false}
    end
  end

  defp guard_tests(_guard, _vars), do: {[], false}

  defp operand(a, vars) when is_atom(a) do
    cond do
      Map.has_key?(vars, a) -> {:path, vars[a]}
      dollar?(a) -> :unknown
      true -> {:const, a}
    end
  end

  defp operand({:const, c}, _vars) when is_atom(c) or is_number(c) or is_binary(c),
    do: {:const, c}

  defp operand(x, _vars) when is_number(x) or is_binary(x), do: {:const, x}
  defp operand(_x, _vars), do: :unknown

  ## select_replace

  @doc false
  # ETS's rule for select_replace (db_match_keeps_key in erl_db_util.c):
  # a clause keeps the key if its body is the single expression `:"$_"`,
  # or a tuple construction `{{...}}` or constant `{:const, tuple}` whose
  # key element is provably the head's key element (the same variable, the
  # same literal, or `{:element, keypos, :"$_"}`). ETS rejects other specs
  # with badarg even when they would keep the key at run time.
  @spec keeps_key?({term, [term], [term]}, pos_integer) :: boolean
  def keeps_key?({_head, _guards, [:"$_"]}, _keypos), do: true

  def keeps_key?({head, _guards, [single]}, keypos)
      when is_tuple(head) and tuple_size(head) >= keypos do
    case construction(single) do
      {:ok, built, const?} when is_tuple(built) and tuple_size(built) >= keypos ->
        key = elem(built, keypos - 1)

        eq_body?(elem(head, keypos - 1), key, const?) or
          (not const? and key === {:element, keypos, :"$_"})

      _ ->
        false
    end
  end

  def keeps_key?(_clause, _keypos), do: false

  defp construction({:const, t}), do: {:ok, t, true}
  defp construction({t}), do: {:ok, t, false}
  defp construction(_), do: :error

  # Whether body expression `b` always builds the term that head pattern
  # `a` matched; `const?` while inside `{:const, _}` (erl_db_util.c,
  # db_match_eq_body).
  defp eq_body?(a, [bh | bt], const?) do
    case a do
      [ah | at] -> eq_body?(ah, bh, const?) and eq_body?(at, bt, const?)
      _ -> false
    end
  end

  defp eq_body?(a, b, false) when is_tuple(b) do
    case b do
      {t} when is_tuple(t) -> eq_tuple?(a, t, false)
      {:const, t} -> eq_body?(a, t, true)
      _ -> false
    end
  end

  defp eq_body?(a, b, true) when is_tuple(b), do: eq_tuple?(a, b, true)
  defp eq_body?(_a, %{}, _const?), do: false

  defp eq_body?(a, b, const?) do
    a === b and a not in [:_, :"$$", :"$_"] and not (const? and variable?(a))
  end

  defp eq_tuple?(a, b, const?) when is_tuple(a) and tuple_size(a) == tuple_size(b) do
    a
    |> Tuple.to_list()
    |> Enum.zip(Tuple.to_list(b))
    |> Enum.all?(fn {x, y} -> eq_body?(x, y, const?) end)
  end

  defp eq_tuple?(_a, _b, _const?), do: false
end
