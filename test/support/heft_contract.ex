defmodule Heft.Contract do
  @moduledoc """
  The backend adapter of the ETS contract suite.

  Every contract test is written once against a backend module `m`, which is
  either `:ets` or `Heft`; both expose the same functions with the same
  arities, so a test body calls `m.insert(tab, obj)` and means either one.
  `Heft.Contract.Case.contract/3` turns one body into one ExUnit test per
  backend.

  The Heft variant of a test is skipped (with the reason as the skip message)
  while Heft lacks something the test needs: `Heft.new/2` itself, a table type
  (`type: :bag`, probed by creating such a table), or functions
  (`functions: [select: 2]`). This is the hook for the later table types and
  the match-spec functions: their tests run against `:ets` today and switch on
  for Heft as soon as Heft supports them.

  `HEFT_CONTRACT_OPTS` (an Elixir keyword list literal, e.g.
  `"[compression: :none]"`) adds Heft-only options to every Heft table the
  suite creates, so the whole contract can be run per Heft configuration.
  """

  @backends [:ets, Heft]

  @doc "The backend modules every contract test runs against."
  def backends, do: @backends

  @doc "A short label for test names."
  def label(:ets), do: ":ets"
  def label(Heft), do: "Heft"

  @doc "True once the Heft module exists and exports `new/2`."
  def heft_available? do
    Code.ensure_loaded?(Heft) and function_exported?(Heft, :new, 2)
  end

  @doc """
  Why the `m` variant of a test with these requirements cannot run, or nil.

  Requirements: `type: :bag | :duplicate_bag | :ordered_set | :set`,
  `functions: [name: arity, ...]`, and `needs_heft: true` for a test that
  uses both backends at once (then the :ets variant waits for Heft too).
  """
  def skip_reason(:ets, requirements) do
    functions = Keyword.get(requirements, :functions, [])

    cond do
      requirements[:needs_heft] && not heft_available?() ->
        "needs both backends, and Heft.new/2 is not implemented yet"

      (missing = Enum.reject(functions, fn {f, a} -> function_exported?(:ets, f, a) end)) != [] ->
        "the ETS of OTP #{System.otp_release()} has no " <>
          Enum.map_join(missing, ", ", fn {f, a} -> "#{f}/#{a}" end)

      true ->
        nil
    end
  end

  def skip_reason(Heft, requirements) do
    type = Keyword.get(requirements, :type, :set)
    functions = Keyword.get(requirements, :functions, [])

    cond do
      not heft_available?() ->
        "Heft.new/2 is not implemented yet: this contract test runs against :ets only"

      (missing = Enum.reject(functions, fn {f, a} -> function_exported?(Heft, f, a) end)) != [] ->
        "Heft does not export " <> Enum.map_join(missing, ", ", fn {f, a} -> "#{f}/#{a}" end)

      not supports_type?(Heft, type) ->
        "Heft does not support table type #{inspect(type)} yet"

      true ->
        nil
    end
  end

  @doc "Whether backend `m` can create a table of `type` (probed, then deleted)."
  def supports_type?(:ets, _type), do: true

  def supports_type?(m, type) do
    tab = m.new(:heft_contract_type_probe, [type])
    m.delete(tab)
    true
  rescue
    _ -> false
  end

  @doc "Heft-only options from HEFT_CONTRACT_OPTS (none for other backends)."
  def extra_opts(Heft) do
    case System.get_env("HEFT_CONTRACT_OPTS") do
      nil -> []
      "" -> []
      text -> text |> Code.eval_string() |> elem(0)
    end
  end

  def extra_opts(_other), do: []

  @doc "A fresh atom, for named tables and renames."
  def unique_name(prefix \\ "heft_contract") do
    :"#{prefix}_#{System.unique_integer([:positive])}"
  end

  @doc """
  A new table of backend `m` owned by the calling process. The name is unique
  so that a test may add `:named_table`; `new/3` takes an explicit name.
  """
  def new(m, opts \\ []), do: new(m, unique_name(), opts)
  def new(m, name, opts), do: m.new(name, opts ++ extra_opts(m))

  @doc "A table with `objects` inserted."
  def new_with(m, objects, opts \\ []) do
    tab = new(m, opts)
    true = m.insert(tab, objects)
    tab
  end

  @doc "The tag of the message an heir or a give_away receiver gets."
  def transfer_tag(:ets), do: :"ETS-TRANSFER"
  def transfer_tag(Heft), do: :"HEFT-TRANSFER"

  @doc """
  Runs `fun` and returns `{:ok, result}` or `{:raise, exception_module}`:
  the contract compares exceptions by type only.
  """
  def outcome(fun) do
    {:ok, fun.()}
  rescue
    e -> {:raise, e.__struct__}
  catch
    kind, _ -> {:caught, kind}
  end

  @doc """
  Sorts terms in a total order: term order first, then the external format,
  so that 1 / 1.0 (and 0.0 / -0.0), which term order calls equal, still sort
  the same way whatever order they came in.
  """
  def canonical_sort(terms), do: Enum.sort_by(terms, &{&1, exact(&1)})

  @doc """
  The exact identity of a term: unlike `===`, it tells 0.0 from -0.0 on OTP
  25 (where 0.0 =:= -0.0), and equal maps built differently compare equal.
  """
  def exact(term), do: :erlang.term_to_binary(term, [:deterministic])

  @doc "The keys in first/next traversal order (each must appear once)."
  def traversal(m, tab), do: traversal(m, tab, m.first(tab), [])

  defp traversal(_m, _tab, :"$end_of_table", acc), do: Enum.reverse(acc)
  defp traversal(m, tab, key, acc), do: traversal(m, tab, m.next(tab, key), [key | acc])

  @doc """
  The keys of a first/next walk that calls `fun.(key)` at each key before
  stepping on from it (to delete it, say).
  """
  def traversal_with(m, tab, fun) do
    Stream.unfold(m.first(tab), fn
      :"$end_of_table" ->
        nil

      key ->
        fun.(key)
        {key, m.next(tab, key)}
    end)
    |> Enum.to_list()
  end

  @doc "tab2list in a canonical order (set traversal order is unspecified)."
  def contents(m, tab), do: canonical_sort(m.tab2list(tab))

  @doc "Zero-arity functions that each call one table function on `tab`."
  def all_calls(m, tab) do
    [
      insert: fn -> m.insert(tab, {1, 1}) end,
      insert_new: fn -> m.insert_new(tab, {2, 2}) end,
      lookup: fn -> m.lookup(tab, 1) end,
      lookup_element: fn -> m.lookup_element(tab, 1, 2) end,
      member: fn -> m.member(tab, 1) end,
      take: fn -> m.take(tab, 1) end,
      delete_key: fn -> m.delete(tab, 1) end,
      delete_object: fn -> m.delete_object(tab, {1, 1}) end,
      delete_all_objects: fn -> m.delete_all_objects(tab) end,
      update_counter: fn -> m.update_counter(tab, 1, 1) end,
      update_counter_default: fn -> m.update_counter(tab, 1, 1, {1, 0}) end,
      update_element: fn -> m.update_element(tab, 1, {2, 0}) end,
      first: fn -> m.first(tab) end,
      next: fn -> m.next(tab, 1) end,
      foldl: fn -> m.foldl(fn _, acc -> acc end, 0, tab) end,
      tab2list: fn -> m.tab2list(tab) end,
      give_away: fn -> m.give_away(tab, spawn(fn -> :ok end), :gift) end,
      rename: fn -> m.rename(tab, unique_name()) end,
      delete_table: fn -> m.delete(tab) end
    ]
  end

  # ---------------------------------------------------------------------------
  # Helper processes: tables owned by someone else, calls from someone else.

  @doc """
  Starts a helper process that runs functions on request (see `run_in/2`) and
  stays alive until `stop/1`. It is not linked to the test.
  """
  def start_process do
    spawn(fn -> serve() end)
  end

  defp serve do
    receive do
      {:run, from, ref, fun} ->
        send(from, {ref, outcome(fun)})
        serve()

      :stop ->
        :ok
    end
  end

  @doc "Runs `fun` in helper `pid`; returns its `outcome/1`."
  def run_in(pid, fun) do
    ref = Process.monitor(pid)
    send(pid, {:run, self(), ref, fun})

    receive do
      {^ref, result} ->
        Process.demonitor(ref, [:flush])
        result

      {:DOWN, ^ref, :process, ^pid, reason} ->
        raise "helper process #{inspect(pid)} died: #{inspect(reason)}"
    end
  end

  @doc "Runs `fun` in a fresh short-lived process; returns its `outcome/1`."
  def in_other_process(fun) do
    pid = start_process()
    result = run_in(pid, fun)
    stop(pid)
    result
  end

  @doc """
  Stops helper `pid` (or kills any process with `:kill`) and returns once its
  'DOWN' has arrived: for ETS, the dead owner's tables are gone (or handed to
  the heir) by then, and the contract demands the same of Heft.
  """
  def stop(pid, how \\ :stop) do
    ref = Process.monitor(pid)
    if how == :kill, do: Process.exit(pid, :kill), else: send(pid, :stop)

    receive do
      {:DOWN, ^ref, :process, ^pid, _} -> :ok
    end
  end

  @doc "A pid that is certainly dead."
  def dead_pid do
    pid = spawn(fn -> :ok end)
    stop(pid, :kill)
    pid
  end
end
