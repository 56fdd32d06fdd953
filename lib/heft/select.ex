defmodule Heft.Select do
  # The select family (documented in lib/heft.ex): the spec is compiled
  # once (Heft.MatchSpec) and run by :ets.match_spec_run/2 over batches of
  # decoded objects, so results are what ETS computes for the same objects.
  #
  # Where batches come from (a "source"):
  #   {:scan, dir, range, cursor, sieve}
  #                    - chunks of about @chunk objects from the chunk NIFs,
  #                      resumable from the cursor they return (:start
  #                      first), walking :forward or (select_reverse on an
  #                      ordered_set) :backward, over the whole table
  #                      (range nil) or an ordered_set's key range
  #                      `{lo, hi}` (Heft.MatchSpec.plan/3), which the NIF
  #                      finds by binary search and leaves at its end;
  #   {:keys, keys}    - lookups, when Heft.MatchSpec.plan/3 found that the
  #                      spec can only match these keys (in an ordered_set,
  #                      in walk order);
  #   :done.
  # Only one batch is decoded at a time: memory grows by the results, not
  # by the table. Each NIF call stays within its scheduler budget (a big
  # chunk moves to a dirty scheduler), and between calls the caller can be
  # preempted.
  #
  # A continuation (select/3, match/3, match_object/3) is
  #   {:heft_select, ref, spec, ms, limit, source, pending}
  # where `ref` is the table's own reference (a named table's too, so that
  # the continuation belongs to that table and raises once it is deleted,
  # even if another table takes its name) and `pending` holds results
  # computed beyond the limit (at most one batch's worth): the next call
  # returns them first. continue/1 checks every part, so that a forged
  # continuation raises ArgumentError.
  #
  # select_delete and select_replace run the spec rewritten to return
  # `{result, object}` and then delete or replace each object atomically
  # only if it is still exactly that object (select.rs).
  @moduledoc false

  import Heft.Native, only: [call: 1]
  alias Heft.{Args, MatchSpec, Native}

  @chunk 256
  # Records a sieved chunk walks: most are dropped undecoded.
  @sieved_chunk 1024
  @replace_rounds 16
  @stats :heft_select_stats

  @type ref :: reference | atom

  ## select/2 and friends

  @spec select(ref, MatchSpec.t(), :forward | :backward) :: [term]
  def select(ref, spec, dir \\ :forward) when is_atom(dir) do
    ms = MatchSpec.compile!(spec)

    case source(ref, spec, :read, dir, dir == :backward) do
      {:overrun, _dir, range, cursor, open} ->
        # ETS's select_reverse/2 walks forward and reverses.
        {keypos, _ordered} = Native.select_access(ref, false)
        source = {:overrun, :forward, range, cursor, open}
        {results, :done} = overrun({ref, ms, keypos, :all}, source, [], 0)
        Enum.reverse(results)

      {:keys, [key]} ->
        # One key (the usual bound-key select): one lookup, no fold.
        {objects, :done} = batch(ref, {:key, key, []})
        MatchSpec.run(objects, ms)

      source ->
        ref
        |> fold(source, [], fn objects, acc -> [MatchSpec.run(objects, ms) | acc] end)
        |> Enum.reverse()
        |> Enum.concat()
    end
  end

  @spec select_limit(ref, MatchSpec.t(), pos_integer, :forward | :backward) ::
          {[term], term} | :"$end_of_table"
  def select_limit(ref, spec, limit, dir \\ :forward) do
    check_limit!(limit)
    ms = spec |> tagged() |> MatchSpec.compile!()
    source = source(ref, spec, :read, dir, true)
    next({:heft_select, instance(ref), spec, ms, limit, source, []}, true)
  end

  # The reference of the table `ref` names now.
  defp instance(name) when is_atom(name) do
    case Native.whereis(name) do
      %Heft.Table{ref: ref} -> ref
      _ -> raise ArgumentError, "the table #{inspect(name)} does not exist"
    end
  end

  defp instance(ref), do: ref

  @spec continue(term) :: {[term], term} | :"$end_of_table"
  def continue(:"$end_of_table"), do: :"$end_of_table"

  def continue({:heft_select, ref, spec, ms, limit, source, pending} = cont)
      when is_reference(ref) and is_list(spec) and is_list(pending) do
    unless small_limit?(limit) and valid_source?(source) and Args.proper_list?(pending),
      do: invalid_continuation!(cont)

    # A compiled spec does not survive every trip (another node, a file):
    # compile it again from the spec kept beside it.
    ms =
      if (ms == nil and spec == []) or (is_reference(ms) and :ets.is_compiled_ms(ms)),
        do: ms,
        else: spec |> tagged() |> MatchSpec.compile!()

    # The table must still exist and be readable, even when the results
    # pending are enough.
    _ = Native.select_access(ref, false)
    next(put_elem(cont, 3, ms), false)
  end

  def continue(other), do: invalid_continuation!(other)

  defp invalid_continuation!(cont),
    do: raise(ArgumentError, "not a select continuation: #{inspect(cont, limit: 8)}")

  # The sources fetch/2 reads; cursors and range bounds are the NIF's to
  # check (it raises ArgumentError for a bad one).
  defp valid_source?(:done), do: true
  defp valid_source?({:keys, keys}), do: Args.proper_list?(keys)

  defp valid_source?({:scan, dir, range, cursor, sieve}) when dir in [:forward, :backward] do
    (range == nil or match?({_lo, _hi}, range)) and (sieve == nil or is_list(sieve)) and
      (cursor == :start or match?({hash, key} when is_integer(hash) and is_binary(key), cursor))
  end

  defp valid_source?({:overrun, dir, {lo, hi}, cursor, open}) when is_boolean(open),
    do:
      match?({_, b} when is_boolean(b), lo) and match?({_, b} when is_boolean(b), hi) and
        valid_source?({:scan, dir, nil, cursor, nil})

  defp valid_source?(_source), do: false

  # repair_continuation/2 (lib/heft.ex): a continuation whose compiled spec
  # did not survive the external term format gets `spec` compiled again
  # (as ETS does, from the spec the caller gives); any other comes back as
  # it is.
  @spec repair(term, MatchSpec.t()) :: term
  def repair(:"$end_of_table", _spec), do: :"$end_of_table"

  def repair(cont, spec)
      when is_tuple(cont) and tuple_size(cont) >= 7 and elem(cont, 0) == :heft_select do
    ms = elem(cont, 3)

    if ms == nil or :ets.is_compiled_ms(ms),
      do: cont,
      else: put_elem(cont, 3, spec |> tagged() |> MatchSpec.compile!())
  end

  def repair(other, _spec),
    do: raise(ArgumentError, "not a select continuation: #{inspect(other, limit: 8)}")

  # For heft_mnesia, whose continuations cross nodes by RPC and must be
  # plain data: `portable/1` drops what only this VM can use (the table's
  # resource and the compiled spec), `resume/2` puts a table back in and
  # continues (the spec is compiled again from the copy kept beside it).
  @doc false
  @spec portable(term) :: term
  def portable(:"$end_of_table"), do: :"$end_of_table"

  def portable({:heft_select, _ref, spec, _ms, limit, source, pending}),
    do: {:heft_select, nil, spec, nil, limit, source, pending}

  @doc false
  @spec resume(Heft.Table.t(), term) :: {[term], term} | :"$end_of_table"
  def resume(_tab, :"$end_of_table"), do: :"$end_of_table"

  def resume(%Heft.Table{ref: ref}, {:heft_select, nil, spec, nil, _, _, _} = cont),
    do:
      cont
      |> put_elem(1, ref)
      |> put_elem(3, spec |> tagged() |> MatchSpec.compile!())
      |> continue()

  def resume(_tab, other),
    do: raise(ArgumentError, "not a portable select continuation: #{inspect(other, limit: 8)}")

  # A chunk of select/3 and friends, as ETS cuts it (erl_db_tree.c and
  # erl_db_hash.c). `ms` returns `{result, object}` (tagged/1), so that each
  # result is known by its object's key.
  #
  # An ordered_set returns exactly `limit` results (fewer at the end) and
  # resumes after the key of the last one's object, reading the table as it
  # is at the next call; nothing is kept.
  #
  # Other tables walk whole keys: matches of each key, in the key's order,
  # go in front of the ones gathered so far (`pending`, the results left
  # from the last call, first), and the walk stops after the key that
  # brought them to `limit` or more. Of those, a first call returns the
  # last `limit` and keeps the others; a continuation keeps the first
  # ones beyond `limit` in reverse and returns the rest. So a bag key with
  # objects 1..5 comes back, 2 at a time, as [4, 5], [2, 3], [1], as from
  # ETS, and what is kept between calls is what ETS keeps.
  defp next({:heft_select, ref, _spec, ms, limit, source, pending} = cont, first?) do
    {keypos, ordered} = Native.select_access(ref, false)
    walk = {ref, ms, keypos, limit}

    {results, source, pending} =
      if ordered,
        do: ordered_chunk(walk, source, [], first? and match?({:keys, [_]}, source)),
        else: hash_chunk(walk, source, pending, length(pending), first?)

    case {results, source, pending} do
      {[], :done, []} -> :"$end_of_table"
      {results, :done, []} -> {results, :"$end_of_table"}
      {results, source, pending} -> {results, cont |> put_elem(5, source) |> put_elem(6, pending)}
    end
  end

  # {results, source, []}: `acc` holds the results so far, last first.
  # ETS looks up a `lone` key the spec binds (and ends there); between
  # several it walks, and a full chunk resumes.
  defp ordered_chunk(_walk, :done, acc, _lone), do: {Enum.reverse(acc), :done, []}

  defp ordered_chunk(walk, {:overrun, _, _, _, _} = source, [], _lone) do
    {tagged, source} = overrun(walk, source, [], 0)
    {Enum.map(tagged, &elem(&1, 0)), source, []}
  end

  defp ordered_chunk({ref, ms, keypos, limit} = walk, source, acc, lone) do
    {objects, rest} = batch(ref, one_key_at_a_time(source))
    tagged = MatchSpec.run(objects, ms)
    wanted = limit - length(acc)

    if length(tagged) < wanted do
      acc = Enum.reduce(tagged, acc, fn {result, _object}, acc -> [result | acc] end)
      ordered_chunk(walk, rest, acc, lone)
    else
      {now, _beyond} = Enum.split(tagged, wanted)
      {_, last} = List.last(now)
      results = Enum.reverse(acc, Enum.map(now, &elem(&1, 0)))

      case resume_after(ref, keypos, source, rest, last) do
        :done when not lone -> {results, {:keys, []}, []}
        source -> {results, source, []}
      end
    end
  end

  # {results, source, pending}: `m` holds the results gathered, `got` of
  # them, in ETS's match list order.
  #
  # Keys the spec binds are all looked up, whatever the limit, as ETS
  # walks every bucket they name (erl_db_hash.c stops at a limit only
  # between the buckets of a whole walk): the end comes with the last.
  defp hash_chunk({ref, ms, keypos, _limit} = walk, {:keys, _} = source, m, got, first?) do
    {objects, rest} = batch(ref, source)
    {m, got, nil} = take_keys(MatchSpec.run(objects, ms), keypos, m, got, :all)
    hash_chunk(walk, rest, m, got, first?)
  end

  defp hash_chunk({ref, ms, keypos, limit} = walk, source, m, got, first?)
       when got < limit and source != :done do
    {objects, rest} = batch(ref, source)
    {m, got, stop} = take_keys(MatchSpec.run(objects, ms), keypos, m, got, limit)

    source =
      case stop do
        nil -> rest
        object -> resume_after(ref, keypos, source, rest, object)
      end

    hash_chunk(walk, source, m, got, first?)
  end

  defp hash_chunk({_ref, _ms, _keypos, limit}, source, m, got, first?) when got > limit do
    {front, back} = Enum.split(m, got - limit)
    if first?, do: {back, source, front}, else: {back, source, Enum.reverse(front)}
  end

  defp hash_chunk(_walk, source, m, _got, _first?), do: {m, source, []}

  # Puts the tagged results of a batch in front of `m`, a key's at a time,
  # up to the key that brings them to `limit` (never with `:all`): {m, got,
  # nil} if the batch ran out first, else {m, got, an object of that key}.
  # A key's objects are next to each other in a batch.
  defp take_keys([], _keypos, m, got, _limit), do: {m, got, nil}

  defp take_keys([{_, object} | _] = tagged, keypos, m, got, limit) do
    key = elem(object, keypos - 1)
    {mine, others} = Enum.split_while(tagged, fn {_, o} -> elem(o, keypos - 1) === key end)
    m = Enum.map(mine, &elem(&1, 0)) ++ m
    got = got + length(mine)

    if limit != :all and got >= limit,
      do: {m, got, object},
      else: take_keys(others, keypos, m, got, limit)
  end

  # Lookups one key at a time, so that a chunk can stop after any of them.
  defp one_key_at_a_time({:keys, [key | keys]}), do: {:key, key, keys}
  defp one_key_at_a_time(source), do: source

  # Where a walk that stopped after the key of `object` resumes (`rest`:
  # what its last batch left). Keys looked up go on with those left. A walk
  # that filled its limit resumes even at the end of the table, as ETS's
  # does (the next call sees keys inserted meanwhile, or that the table is
  # gone). ETS's hash walk ends instead when the limit falls in its last
  # bucket (erl_db_hash.c), a matter of where its hash puts the key; Heft
  # hashes with a random key per table, so such an end would come by chance,
  # and its walk always resumes (the next call answers :"$end_of_table").
  defp resume_after(_ref, _keypos, {:keys, _}, rest, _object), do: rest

  defp resume_after(ref, keypos, {:scan, dir, range, _, sieve}, _rest, object),
    do: {:scan, dir, range, call(key_cursor(ref, elem(object, keypos - 1))), sieve}

  # ETS takes a limit that is a positive small integer (below 2^59 on a
  # 64-bit VM, 2^27 on a 32-bit one) and raises badarg for a bignum.
  @max_limit Bitwise.bsl(1, 8 * :erlang.system_info(:wordsize) - 5) - 1

  defp small_limit?(limit), do: is_integer(limit) and limit > 0 and limit <= @max_limit

  defp check_limit!(limit) do
    unless small_limit?(limit) do
      raise ArgumentError,
            "the limit must be an integer from 1 to #{@max_limit}, got: #{inspect(limit)}"
    end
  end

  @spec select_count(ref, MatchSpec.t()) :: non_neg_integer
  def select_count(ref, spec) do
    ms = MatchSpec.compile!(spec)

    count = fn objects, n ->
      Enum.reduce(MatchSpec.run(objects, ms), n, fn
        true, n -> n + 1
        _, n -> n
      end)
    end

    if MatchSpec.counts_all?(spec) do
      _ = Native.select_access(ref, false)
      call(size(ref))
    else
      source = source(ref, spec, :read)

      # A sieve that states the whole spec counts what it is sure of
      # without decoding it; the VM runs the spec on the rest.
      with {:scan, _dir, range, :start, [_ | _] = sieve} <- source,
           true <- MatchSpec.exact?(spec) do
        count_sieved(ref, sieve, range, :start, 0, count)
      else
        _ -> fold(ref, source, 0, count)
      end
    end
  end

  defp count_sieved(ref, sieve, range, cursor, n, count) do
    {sure, objects, next} = call(sieve_count(ref, sieve, range, cursor, @sieved_chunk))
    n = count.(objects, n + sure)

    case next do
      :"$end_of_table" -> n
      next -> count_sieved(ref, sieve, range, next, n, count)
    end
  end

  @spec select_delete(ref, MatchSpec.t()) :: non_neg_integer | {:error, atom}
  def select_delete(ref, spec) do
    ms = spec |> tagged() |> MatchSpec.compile!()
    source = source(ref, spec, :write)

    # Specs that only look at an object's shape delete without decoding
    # anything (all objects at once, or chunks of tuples of one arity).
    case MatchSpec.deletes_by_shape(spec) do
      :all -> written(call(delete_all_objects(ref)))
      {:arity, arity} -> delete_arity(ref, arity, :start, 0)
      nil -> delete_matching(ref, ms, source)
    end
  catch
    {__MODULE__, error} -> error
  end

  defp delete_arity(ref, arity, cursor, deleted) do
    case written(call(delete_arity(ref, arity, cursor))) do
      {n, :"$end_of_table"} -> deleted + n
      {n, cursor} -> delete_arity(ref, arity, cursor, deleted + n)
    end
  end

  # The objects matched are deleted a batch of at least @chunk at a time
  # (and at the end), not in a call for each chunk that found some: a spec
  # that matches a few objects scattered over the table deletes them in
  # one short call. Each is deleted only if it is still exactly the object
  # matched (select.rs).
  defp delete_matching(ref, ms, source) do
    {n, doomed, _} =
      fold(ref, source, {0, [], 0}, fn objects, {n, doomed, len} ->
        matched = for {true, object} <- MatchSpec.run(objects, ms), do: object
        doomed = [matched | doomed]
        len = len + length(matched)

        if len >= @chunk,
          do: {n + delete_doomed(ref, doomed), [], 0},
          else: {n, doomed, len}
      end)

    n + delete_doomed(ref, doomed)
  end

  defp delete_doomed(ref, doomed),
    do: doomed |> Enum.reverse() |> Enum.concat() |> delete_all(ref)

  # A short list is deleted on a normal scheduler as far as its budget
  # goes; what is left comes back for another call (select.rs).
  defp delete_all([], _ref), do: 0

  defp delete_all(objects, ref) do
    case written(call(delete_objects(ref, objects))) do
      {:more, n, rest} -> n + delete_all(rest, ref)
      n -> n
    end
  end

  # The result of a write NIF, or a throw of its `{:error, reason}` (a
  # persistent table's log or a full disk), caught by the public function.
  defp written({:error, _} = error), do: throw({__MODULE__, error})
  defp written(result), do: result

  @spec select_replace(ref, MatchSpec.t()) :: non_neg_integer | {:error, atom}
  def select_replace(ref, spec) do
    _ = MatchSpec.compile!(spec)
    %{keypos: keypos} = info = Native.info_map(ref)

    if Map.get(info, :type, :set) == :bag do
      raise ArgumentError, "select_replace is not supported on a bag table (as in ETS)"
    end

    unless Enum.all?(spec, &MatchSpec.keeps_key?(&1, keypos)) do
      MatchSpec.invalid!(spec)
    end

    ms = spec |> tagged() |> MatchSpec.compile!()

    fold(ref, source(ref, spec, :write), 0, fn objects, n ->
      n + replace(ref, ms, keypos, MatchSpec.run(objects, ms), @replace_rounds)
    end)
  catch
    {__MODULE__, error} -> error
  end

  # Replaces each `old` by `new` if `old` is still in the table; an object
  # changed meanwhile is looked up again and the spec run on what is there
  # now (as if the walk had reached it after the change).
  defp replace(_ref, _ms, _keypos, [], _rounds), do: 0

  defp replace(ref, ms, keypos, results, rounds) do
    {same, changes} = Enum.split_with(results, fn {new, old} -> exactly?(new, old) end)

    {replaced, lost} =
      if changes == [], do: {0, []}, else: written(call(replace_objects(ref, changes)))

    done = length(same) + replaced

    if lost == [] or rounds == 0 do
      done
    else
      again =
        lost
        |> Enum.map(&elem(&1, keypos - 1))
        |> Enum.uniq()
        |> Enum.flat_map(fn key -> call(lookup(ref, key)) end)

      done + replace(ref, ms, keypos, MatchSpec.run(again, ms), rounds - 1)
    end
  end

  # The same term bit for bit: `===`, and, where 0.0 === -0.0 (OTP 26 and
  # older), the same sign of every zero, so that a replacement that only
  # flips one is written as ETS writes it.
  defp exactly?(a, b) do
    a === b and
      (not Heft.VM.fact(:neg_zero_is_zero) or
         :erlang.term_to_binary(a) == :erlang.term_to_binary(b))
  end

  defp tagged([]), do: []
  defp tagged(spec), do: spec |> tap(&MatchSpec.compile!/1) |> MatchSpec.with_object()

  ## Sources

  # Checks access (raising as ETS does even when nothing would match) and
  # plans the walk. Only an ordered_set walks :backward: select_reverse of
  # any other table is select (as in ETS). `overrun` asks for ETS's walk
  # past the end of a key range where it can find matches (overrun/4), in
  # the walk's direction.
  defp source(ref, spec, access, dir \\ :forward, overrun \\ false) do
    {keypos, ordered} = Native.select_access(ref, access == :write)
    if Process.get(@stats), do: counting()
    dir = if ordered, do: dir, else: :forward

    case spec do
      [] ->
        :done

      _ ->
        case MatchSpec.plan(spec, keypos, ordered) do
          {:lookup, keys} when dir == :backward ->
            {:keys, Enum.reverse(keys)}

          {:lookup, keys} ->
            {:keys, keys}

          {:range, lo, hi} ->
            if overrun and MatchSpec.overruns?(spec, keypos),
              do: {:overrun, dir, {lo, hi}, :start, false},
              else: {:scan, dir, {lo, hi}, :start, MatchSpec.sieve(spec, keypos)}

          :scan ->
            {:scan, dir, nil, :start, MatchSpec.sieve(spec, keypos)}
        end
    end
  end

  # The next batch of objects and what is left, counted in `stats/0`.
  defp batch(ref, source) do
    {objects, rest} = fetch(ref, source)
    kind = if match?({:scan, _, _, _, _}, source), do: :chunks, else: :lookups

    case Process.get(@stats) do
      %{^kind => calls, objects: n} = stats ->
        Process.put(@stats, %{stats | kind => calls + 1, objects: n + length(objects)})

      _ ->
        :ok
    end

    {objects, rest}
  end

  defp fetch(ref, {:scan, dir, range, cursor, nil}) do
    case walk(ref, dir, range, cursor, @chunk) do
      {objects, :"$end_of_table"} -> {objects, :done}
      {objects, cursor} -> {objects, {:scan, dir, range, cursor, nil}}
    end
  end

  # The sieve drops records no clause can match before they are decoded
  # (heft_core's sieve.rs); a chunk walks more of them.
  defp fetch(ref, {:scan, dir, range, cursor, sieve}) do
    case call(sieve_chunk(ref, sieve, range, cursor, @sieved_chunk, dir)) do
      {objects, :"$end_of_table"} -> {objects, :done}
      {objects, cursor} -> {objects, {:scan, dir, range, cursor, sieve}}
    end
  end

  defp fetch(ref, {:key, key, keys}),
    do: {call(lookup(ref, key)), if(keys == [], do: :done, else: {:keys, keys})}

  defp fetch(ref, {:keys, keys}) do
    {now, later} = Enum.split(keys, @chunk)
    objects = Enum.flat_map(now, fn key -> call(lookup(ref, key)) end)
    {objects, if(later == [], do: :done, else: {:keys, later})}
  end

  defp walk(ref, :forward, nil, cursor, size), do: call(chunk(ref, cursor, size))
  defp walk(ref, :backward, nil, cursor, size), do: call(chunk_back(ref, cursor, size))
  defp walk(ref, :forward, range, cursor, size), do: call(range_chunk(ref, range, cursor, size))

  defp walk(ref, :backward, range, cursor, size),
    do: call(range_chunk_back(ref, range, cursor, size))

  ## ETS's walk past the end of a key range
  #
  # ETS checks the end of an ordered_set's key range (erl_db_tree.c,
  # `end_condition`) only while a select call visits its first 1000
  # objects. Past them (the call traps and goes on) and in a continuation,
  # it walks on without the check, and stops only when a stretch of 1000
  # ends beyond the end, its chunk fills, or the table ends. Past the end
  # nothing can match, except a larger map matching a map in a bound key
  # (OTP 26 and older), or where ETS's own comparison of the clause keys
  # put the end short of their matches (both MatchSpec.overruns?/2). For
  # such specs Heft walks as ETS does: select/3, select_reverse/3 and
  # their continuations in their direction, select/2 and select_reverse/2
  # (which ETS walks forward) forward.
  #
  # The source is `{:overrun, dir, {lo, hi}, cursor, open}`: `open` once
  # the end is no longer checked. Returns {results, source} with up to
  # `limit` results (`:all`: every one) of a `ms` that tags them with
  # their object (plain results for `:all`), in key order.
  @ets_stretch 1000

  defp overrun(walk, source, acc, visited, got \\ 0)

  defp overrun({ref, ms, keypos, limit} = walk, source, acc, visited, got) do
    {:overrun, dir, {lo, hi} = range, cursor, open} = source

    now =
      cond do
        not open -> range
        dir == :forward -> {lo, nil}
        true -> {nil, hi}
      end

    {objects, next} = walk(ref, dir, now, cursor, @ets_stretch - visited)
    results = MatchSpec.run(objects, ms)
    visited = visited + length(objects)
    got = got + length(results)
    resume = fn cursor, open -> {:overrun, dir, range, cursor, open} end
    done = fn results -> acc |> Enum.reverse(results) |> Enum.concat() end

    cond do
      limit != :all and got >= limit ->
        {now, _beyond} = Enum.split(results, length(results) - (got - limit))
        {_, last} = List.last(now)
        {done.([now]), resume.(call(key_cursor(ref, elem(last, keypos - 1))), true)}

      # ETS stops at the 1000th object before it looks at the next one.
      visited == @ets_stretch and not open ->
        last = elem(List.last(objects), keypos - 1)
        next = if next == :"$end_of_table", do: call(key_cursor(ref, last)), else: next
        overrun(walk, resume.(next, true), [results | acc], 0, got)

      next == :"$end_of_table" ->
        {done.([results]), :done}

      visited < @ets_stretch ->
        overrun(walk, resume.(next, open), [results | acc], visited, got)

      open and past?(elem(List.last(objects), keypos - 1), dir, range) ->
        {done.([results]), :done}

      true ->
        overrun(walk, resume.(next, true), [results | acc], 0, got)
    end
  end

  # Whether `key` lies beyond the end of `range` the walk in `dir` goes to.
  defp past?(key, :forward, {_lo, {bound, inclusive}}) do
    case MatchSpec.compare_bound(key, bound) do
      :gt -> true
      :eq -> not inclusive
      :lt -> false
    end
  end

  defp past?(key, :backward, {{bound, inclusive}, _hi}) do
    case MatchSpec.compare_bound(key, bound) do
      :lt -> true
      :eq -> not inclusive
      :gt -> false
    end
  end

  defp fold(_ref, :done, acc, _fun), do: acc

  defp fold(ref, source, acc, fun) do
    {objects, source} = batch(ref, source)
    fold(ref, source, fun.(objects, acc), fun)
  end

  @doc false
  # What the calling process's last select-family call (since it planned
  # its walk) fetched: chunk NIF calls, batches of lookups, and objects
  # decoded, once counting/0 has asked for it. For tests that prove a
  # bound key does not scan.
  @spec stats() :: %{chunks: non_neg_integer, lookups: non_neg_integer, objects: non_neg_integer}
  def stats, do: Process.get(@stats, %{chunks: 0, lookups: 0, objects: 0})

  @doc false
  # Starts counting (stats/0) in the calling process.
  @spec counting() :: :ok
  def counting do
    Process.put(@stats, %{chunks: 0, lookups: 0, objects: 0})
    :ok
  end

  @doc false
  # How select would find the objects `spec` can match (for tests and
  # benchmarks): `{:lookup, keys}`, `{:range, lo, hi}` or `:scan`.
  @spec plan(ref, MatchSpec.t()) ::
          :scan | {:lookup, [term]} | {:range, MatchSpec.bound(), MatchSpec.bound()}
  def plan(ref, spec) do
    _ = MatchSpec.compile!(spec)
    {keypos, ordered} = Native.select_access(ref, false)
    MatchSpec.plan(spec, keypos, ordered)
  end
end
