defmodule Heft.Contract.Differential do
  @moduledoc """
  Differential testing: the same random operation sequence runs on an `:ets`
  table (the reference) and on a table of the subject backend, and every
  result must match.

  The subject is `Heft` as soon as `Heft.new/2` exists; until then it is
  `:ets` again, which only proves that the generator and the comparison are
  deterministic (a sanity run, said so in the test name).

  Comparison rules (the deliberate differences are normalized here, nowhere
  else):
    * results are compared with `Heft.Contract.exact/1`: `===` plus the sign
      of zero;
    * exceptions compare by type only (`Heft.Contract.outcome/1`);
    * traversal results (first/next keys, tab2list, foldl) of unordered types
      are compared as canonically sorted lists; a key visited twice still
      shows up as a difference;
    * next/2 is only called on keys that are in the table (next/2 on a missing
      key is a deliberate difference, tested in differences_test.exs).

  A failing sequence is shrunk (operations removed while it still fails) and
  reported with the seed, the run number and the remaining operations.
  """

  import Heft.Contract, only: [outcome: 1, canonical_sort: 1, exact: 1, extra_opts: 1]
  alias Heft.Contract.Gen

  @reference :ets

  @doc "The backend compared against :ets: Heft once it exists, else :ets."
  def subject, do: if(Heft.Contract.heft_available?(), do: Heft, else: :ets)

  @doc "Why the differential run for `type` cannot run against the subject, or nil."
  def skip_reason(type) do
    case subject() do
      Heft -> Heft.Contract.skip_reason(Heft, type: type)
      _ets -> nil
    end
  end

  @doc """
  Runs `runs` random sequences of up to `max_ops` operations on tables of
  `type`; raises ExUnit.AssertionError on the first mismatch. Returns the
  number of operations executed.
  """
  def check(opts) do
    seed = Keyword.get(opts, :seed, Gen.seed())
    type = Keyword.get(opts, :type, :set)
    runs = Keyword.fetch!(opts, :runs)
    max_ops = Keyword.fetch!(opts, :max_ops)
    subject = Keyword.get(opts, :subject, subject())

    Enum.reduce(1..runs, 0, fn run, total ->
      Gen.seed_rand(seed, run)
      scenario = scenario(type, subject, max_ops)

      case execute(scenario) do
        :ok -> total + length(scenario.ops)
        {:mismatch, _, _} -> report(scenario, seed, run)
      end
    end)
  end

  @doc "One random scenario: table options for both sides and the operations."
  def scenario(type, subject, max_ops) do
    keypos = Gen.weighted([{70, fn -> 1 end}, {20, fn -> 2 end}, {10, fn -> 3 end}])
    common = [type, {:keypos, keypos}, Gen.pick([:public, :protected, :private])]

    %{
      type: type,
      keypos: keypos,
      subject: subject,
      ref_opts: common,
      subject_opts: common ++ subject_opts(subject),
      ops: Gen.ops(type, keypos, Gen.int(1..max_ops))
    }
  end

  # Heft-only options, varied per scenario so that every configuration is
  # exercised. HEFT_CONTRACT_OPTS, when set, wins.
  defp subject_opts(Heft) do
    case extra_opts(Heft) do
      [] ->
        compression =
          Gen.weighted([
            {45, fn -> [compression: :zlib, compression_level: Gen.int(0..9)] end},
            {45, fn -> [compression: :none] end},
            {10, fn -> [] end}
          ])

        arena = if Gen.chance(0.1), do: [arena: {:file, System.tmp_dir!()}], else: []
        compression ++ arena

      given ->
        given
    end
  end

  defp subject_opts(_other), do: []

  @doc """
  Runs the scenario's operations on both backends. Returns `:ok`, or
  `{:mismatch, index, trace}` where trace lists `{op, ref_result,
  subject_result}` up to and including the first difference (index is
  `length(ops)` when only the final contents differ).
  """
  def execute(%{ops: ops} = sc) do
    a = @reference.new(:heft_differential, sc.ref_opts)
    b = sc.subject.new(:heft_differential, sc.subject_opts)

    try do
      run_ops(ops ++ [{:final_contents}], sc, a, b, 0, [])
    after
      @reference.delete(a)
      outcome(fn -> sc.subject.delete(b) end)
    end
  end

  defp run_ops([], _sc, _a, _b, _i, _trace), do: :ok

  defp run_ops([op | rest], sc, a, b, i, trace) do
    op = resolve(op, a, sc.keypos)
    ra = normalize(sc.type, op, outcome(fn -> apply_op(@reference, a, op) end))
    rb = normalize(sc.type, op, outcome(fn -> apply_op(sc.subject, b, op) end))
    trace = [{op, ra, rb} | trace]

    if exact(ra) == exact(rb) do
      run_ops(rest, sc, a, b, i + 1, trace)
    else
      {:mismatch, i, Enum.reverse(trace)}
    end
  end

  # Operations whose argument depends on the table's state take it from the
  # reference table, so both sides get the same concrete operation.
  defp resolve({:delete_existing_object, n}, ref_tab, keypos) do
    case canonical_sort(@reference.tab2list(ref_tab)) do
      [] -> {:delete_object, Tuple.duplicate(:none, keypos)}
      objects -> {:delete_object, Enum.at(objects, rem(n, length(objects)))}
    end
  end

  defp resolve({:bulk_insert, from, n}, _ref_tab, keypos),
    do: {:insert, for(k <- from..(from + n - 1), do: Tuple.duplicate(k, keypos + 1))}

  defp resolve(op, _ref_tab, _keypos), do: op

  @doc "Applies one (resolved) operation to a table of backend `m`."
  def apply_op(m, t, {:insert, objs}), do: m.insert(t, objs)
  def apply_op(m, t, {:insert_new, objs}), do: m.insert_new(t, objs)
  def apply_op(m, t, {:delete, key}), do: m.delete(t, key)
  def apply_op(m, t, {:delete_object, obj}), do: m.delete_object(t, obj)
  def apply_op(m, t, {:take, key}), do: m.take(t, key)
  def apply_op(m, t, {:update_counter, key, op}), do: m.update_counter(t, key, op)

  def apply_op(m, t, {:update_counter, key, op, default}),
    do: m.update_counter(t, key, op, default)

  def apply_op(m, t, {:update_element, key, spec}), do: m.update_element(t, key, spec)
  def apply_op(m, t, {:lookup, key}), do: m.lookup(t, key)
  def apply_op(m, t, {:member, key}), do: m.member(t, key)
  def apply_op(m, t, {:lookup_element, key, pos}), do: m.lookup_element(t, key, pos)
  def apply_op(m, t, {:traverse}), do: Heft.Contract.traversal(m, t)
  def apply_op(m, t, {:tab2list}), do: m.tab2list(t)
  def apply_op(m, t, {:foldl}), do: m.foldl(&[&1 | &2], [], t)
  def apply_op(m, t, {:size}), do: m.info(t, :size)
  def apply_op(m, t, {:delete_all_objects}), do: m.delete_all_objects(t)

  def apply_op(m, t, {:bulk_delete, from, n}),
    do: Enum.map(from..(from + n - 1), &m.delete(t, &1)) |> Enum.uniq()

  def apply_op(m, t, {:final_contents}), do: {m.info(t, :size), m.tab2list(t)}

  # Order of traversal is unspecified for :set, :bag and :duplicate_bag.
  defp normalize(:ordered_set, _op, result), do: result

  defp normalize(_type, {kind}, {:ok, list}) when kind in [:traverse, :tab2list, :foldl],
    do: {:ok, canonical_sort(list)}

  defp normalize(_type, {:final_contents}, {:ok, {size, list}}),
    do: {:ok, {size, canonical_sort(list)}}

  defp normalize(_type, _op, result), do: result

  # ---------------------------------------------------------------------------
  # Failure report

  @max_replays 3000

  defp report(scenario, seed, run) do
    shrunk = shrink(scenario, scenario.ops, 0)
    {:mismatch, _i, trace} = execute(%{scenario | ops: shrunk})

    lines =
      trace
      |> Enum.with_index(1)
      |> Enum.map(fn {{op, ra, rb}, n} ->
        # compared with exact/1: a pattern with a repeated variable would
        # call 0.0 and -0.0 the same on OTP 25
        if exact(ra) == exact(rb) do
          "  #{n}. #{inspect(op, limit: 12)}  ->  #{inspect(ra, limit: 12)}"
        else
          "  #{n}. #{inspect(op, limit: 12)}\n" <>
            "       :ets -> #{inspect(ra, limit: 20)}\n" <>
            "       #{inspect(scenario.subject)} -> #{inspect(rb, limit: 20)}   <== DIFFERENT"
        end
      end)

    raise ExUnit.AssertionError,
      message: """
      Differential mismatch, :ets vs #{inspect(scenario.subject)} (#{scenario.type}).
      Seed #{seed}, run #{run}. Replay: HEFT_CONTRACT_SEED=#{seed} mix test test/contract/differential_test.exs
      :ets options:   #{inspect(scenario.ref_opts)}
      #{inspect(scenario.subject)} options: #{inspect(scenario.subject_opts)}
      Shrunk from #{length(scenario.ops)} to #{length(shrunk)} operations (+ final contents check):
      #{Enum.join(lines, "\n")}
      """
  end

  # Delta debugging, coarse to fine: drop chunks of operations while the
  # sequence still fails; bounded by @max_replays executions.
  defp shrink(scenario, ops, replays) do
    {ops, _replays, _} = shrink_pass(scenario, ops, max(div(length(ops), 2), 1), replays)
    ops
  end

  defp shrink_pass(_sc, ops, _chunk, replays) when replays >= @max_replays,
    do: {ops, replays, :done}

  defp shrink_pass(sc, ops, chunk, replays) do
    {ops, replays, removed?} = drop_chunks(sc, ops, chunk, 0, replays, false)

    cond do
      chunk > 1 -> shrink_pass(sc, ops, div(chunk, 2), replays)
      removed? -> shrink_pass(sc, ops, 1, replays)
      true -> {ops, replays, :done}
    end
  end

  defp drop_chunks(_sc, ops, _chunk, start, replays, removed?)
       when start >= length(ops) or replays >= @max_replays,
       do: {ops, replays, removed?}

  defp drop_chunks(sc, ops, chunk, start, replays, removed?) do
    candidate = Enum.take(ops, start) ++ Enum.drop(ops, start + chunk)

    case execute(%{sc | ops: candidate}) do
      {:mismatch, _, _} -> drop_chunks(sc, candidate, chunk, start, replays + 1, true)
      :ok -> drop_chunks(sc, ops, chunk, start + chunk, replays + 1, removed?)
    end
  end
end
