defmodule Heft.Contract.OwnerExitTest do
  @moduledoc """
  What others see of a dead owner's tables, under load, on every scheduler.

  ETS deletes (or hands to the heir) every table of an exiting process before
  the VM sends the process's `EXIT` signals and `DOWN` messages. So whoever
  receives them finds the name free, `all/0` without the tables, `whereis/1`
  `:undefined`, the heir the owner already, and a supervisor can restart a
  crashed owner that creates its named table again at once.

  The owners here are monitored (or linked) from birth, before they create
  any table: the VM then sends their `DOWN` (or `EXIT`) before it gets to
  the monitors a table's implementation may hold on its owner, which is the
  order a supervised process meets. Each round kills all owners at once, one
  group per scheduler, each owner with many tables.

  The one difference left is the heir's mailbox order (Heft moduledoc): ETS
  queues the transfer message before the `EXIT`; Heft's may come after it,
  but the heir owns the tables by the time it sees the `EXIT`.
  """
  use Heft.Contract.Case, async: false

  @rounds 20
  @owners_per_scheduler 3
  @tables_per_owner 200

  defp schedulers, do: :erlang.system_info(:schedulers_online)

  # Schedulers but the first (the first if there is only one).
  defp other_schedulers, do: if(schedulers() > 1, do: 2..schedulers(), else: [1])

  # Owner bodies: make the tables, report them, wait to be killed.
  defp owner_body(m, parent, name, opts) do
    fn ->
      tabs = for _ <- 1..@tables_per_owner, do: new(m, opts)
      named = new(m, name, [:named_table | opts])
      send(parent, {self(), :up, [named | tabs]})
      receive do: (:never -> :ok)
    end
  end

  # Spawns @owners_per_scheduler owners bound to each scheduler with
  # `spawn_opts` (:monitor or :link); returns [{pid, monitor_ref | nil, name,
  # tables}] once all are up.
  defp spawn_owners(m, opts, spawn_opts, scheds \\ 1..schedulers()) do
    me = self()

    started =
      for s <- scheds, _ <- 1..@owners_per_scheduler do
        name = unique_name("owner_exit")
        spawned = :erlang.spawn_opt(owner_body(m, me, name, opts), [{:scheduler, s} | spawn_opts])

        case spawned do
          {pid, ref} -> {pid, ref, name}
          pid -> {pid, nil, name}
        end
      end

    for {pid, ref, name} <- started do
      receive do
        {^pid, :up, tabs} -> {pid, ref, name, tabs}
      end
    end
  end

  defp kill_all(owners), do: Enum.each(owners, fn {pid, _, _, _} -> Process.exit(pid, :kill) end)

  # Receives the next DOWN of one of `owners`; returns that owner's entry.
  defp next_down(owners) do
    receive do
      {:DOWN, ref, :process, pid, _} ->
        List.keyfind(owners, pid, 0) || raise("stray DOWN #{inspect({ref, pid})}")
    end
  end

  # What is wrong, seen right after the owner's DOWN: a list of atoms.
  defp dead_owner_failures(m, name, tabs) do
    all = MapSet.new(m.all())

    [
      whereis: m.whereis(name) != :undefined,
      info: m.info(name) != :undefined,
      all: Enum.any?(tabs, &MapSet.member?(all, &1)),
      recreate: recreate(m, name) != :ok
    ]
    |> Enum.filter(&elem(&1, 1))
    |> Enum.map(&elem(&1, 0))
  end

  defp recreate(m, name) do
    ^name = new(m, name, [:named_table])
    true = m.delete(name)
    :ok
  rescue
    ArgumentError -> :raised
  end

  # @rounds rounds of owners (public tables) killed at once: as each DOWN
  # arrives, `check.(name, tabs)` lists what is wrong; all of it, by round.
  defp after_each_down(m, check) do
    for round <- 1..@rounds,
        owners = spawn_owners(m, [:public], [:monitor]),
        kill_all(owners),
        _ <- owners,
        {_pid, _ref, name, tabs} = next_down(owners),
        failure <- check.(name, tabs),
        do: {round, failure}
  end

  defp assert_none(failures) do
    assert failures == [],
           "#{length(failures)} failures in #{@rounds} rounds of " <>
             "#{schedulers() * @owners_per_scheduler} owners: " <>
             inspect(Enum.frequencies_by(failures, &elem(&1, 1)))
  end

  contract "right after each owner's DOWN: its name is free, all/0 and whereis/1 forget its tables (all schedulers, killed at once)" do
    assert_none(after_each_down(m, &dead_owner_failures(m, &1, &2)))
  end

  contract "a stale handle of a dead owner's table raises right after the DOWN" do
    late_write = fn _name, tabs ->
      for tab <- Enum.take_random(tabs, 5),
          outcome(fn -> m.insert(tab, {:late}) end) != {:raise, ArgumentError},
          do: :write_succeeded
    end

    assert_none(after_each_down(m, late_write))
  end

  # A supervised owner of a named table, killed again and again: each
  # restart creates the table again in init/1 and says how that went.
  defmodule NamedOwner do
    use GenServer
    @tables_per_owner 200

    # Each start on the next scheduler: a restart runs on another
    # scheduler than the dead child's exit.
    def start_link({m, name, test, starts}) do
      n = :atomics.add_get(starts, 1, 1)
      s = 1 + rem(n, :erlang.system_info(:schedulers_online))
      GenServer.start_link(__MODULE__, {m, name, test}, spawn_opt: [{:scheduler, s}])
    end

    @impl true
    def init({m, name, test}) do
      # Tables of its own first, as a real owner has: the VM tells their
      # implementation of the owner's death in creation order.
      for _ <- 1..@tables_per_owner, do: m.new(:unnamed, [:public])

      result =
        try do
          m.new(name, [:named_table, :public])
          :ok
        rescue
          e in ArgumentError -> {:error, Exception.message(e)}
        end

      send(test, {:init, self(), result})
      if result == :ok, do: {:ok, name}, else: {:stop, result}
    end
  end

  contract "a supervisor restarting a killed owner of a named table recreates it every time" do
    name = unique_name("supervised")
    test = self()

    starts = :atomics.new(1, [])
    child = %{id: :owner, start: {NamedOwner, :start_link, [{m, name, test, starts}]}}

    {:ok, sup} =
      Supervisor.start_link([child],
        strategy: :one_for_one,
        max_restarts: 1_000,
        max_seconds: 1
      )

    assert_receive {:init, first, :ok}

    {last, failed} =
      Enum.reduce(1..@rounds, {first, 0}, fn _, {pid, failed} ->
        Process.exit(pid, :kill)
        await_restart(failed)
      end)

    assert failed == 0, "#{failed} of #{@rounds} restarts could not create the table"
    assert m.info(name, :owner) == last
    Supervisor.stop(sup)
  end

  # Waits for the next successful init, counting the failed ones before it.
  defp await_restart(failed) do
    receive do
      {:init, pid, :ok} -> {pid, failed}
      {:init, _pid, {:error, _}} -> await_restart(failed + 1)
    after
      5_000 -> flunk("no restart")
    end
  end

  # The heir: traps exits, links to the owners it spawns and, the moment it
  # receives an owner's EXIT, checks what it sees. Answers the test with
  # `{:heir_saw, failures, transfers_queued, transfers}`: what was wrong, for
  # each EXIT whether every transfer message of that owner was already in
  # the mailbox, and every transfer message received.
  defp heir_loop(m, test) do
    Process.flag(:trap_exit, true)
    me = self()
    owners = spawn_owners(m, [{:heir, me, :inherit}], [:link], other_schedulers())
    send(test, {:owners, owners})

    seen =
      for _ <- owners do
        receive do
          {:EXIT, pid, :killed} ->
            {^pid, _, name, tabs} = List.keyfind(owners, pid, 0)
            failures = inherited_failures(m, name, tabs)
            {failures, transfers_queued(m, pid, tabs)}
        end
      end

    failures = Enum.flat_map(seen, &elem(&1, 0))
    queued = Enum.map(seen, &elem(&1, 1))
    send(test, {:heir_saw, failures, queued, heir_mailbox(m, owners)})
    receive do: (:stop -> :ok)
  end

  # True if the mailbox holds a transfer of each of `tabs` from `owner`.
  defp transfers_queued(m, owner, tabs) do
    tag = transfer_tag(m)
    {:messages, msgs} = Process.info(self(), :messages)
    got = for {^tag, tab, ^owner, :inherit} <- msgs, into: MapSet.new(), do: tab
    Enum.all?(tabs, &MapSet.member?(got, &1))
  end

  defp inherited_failures(m, name, tabs) do
    all = MapSet.new(m.all())
    me = self()

    # The named table was created last: checked first.
    [
      named_owner: m.info(name, :owner) != me,
      whereis: m.whereis(name) == :undefined,
      owner: Enum.any?(tabs, &(m.info(&1, :owner) != me)),
      writable: Enum.any?(tabs, &(outcome(fn -> m.insert(&1, {:mine}) end) != {:ok, true})),
      all: not Enum.all?(tabs, &MapSet.member?(all, &1))
    ]
    |> Enum.filter(&elem(&1, 1))
    |> Enum.map(&elem(&1, 0))
  end

  # Every transfer message, in mailbox order.
  defp heir_mailbox(m, owners) do
    tag = transfer_tag(m)
    expected = Enum.sum(Enum.map(owners, fn {_, _, _, tabs} -> length(tabs) end))
    collect_transfers(tag, expected, [])
  end

  defp collect_transfers(_tag, 0, acc), do: Enum.reverse(acc)

  defp collect_transfers(tag, n, acc) do
    receive do
      {^tag, tab, from, :inherit} -> collect_transfers(tag, n - 1, [{tab, from} | acc])
    after
      5_000 -> Enum.reverse(acc)
    end
  end

  # Runs `rounds` rounds of heirs; returns [{failures, queued}] per round,
  # having checked that every table was transferred exactly once.
  defp heir_rounds(m, rounds) do
    test = self()

    for _ <- 1..rounds do
      # The heir on scheduler 1, the owners on all.
      heir = :erlang.spawn_opt(fn -> heir_loop(m, test) end, [{:scheduler, 1}])
      assert_receive {:owners, owners}, 10_000
      kill_all(owners)
      assert_receive {:heir_saw, failures, queued, transfers}, 20_000
      expected = for {pid, _, _, tabs} <- owners, tab <- tabs, do: {tab, pid}
      assert Enum.sort(transfers) == Enum.sort(expected)
      send(heir, :stop)
      {failures, queued}
    end
  end

  contract "a linked heir trapping exits owns every table of an owner when it sees the owner's EXIT" do
    failures = m |> heir_rounds(div(@rounds, 2)) |> Enum.flat_map(&elem(&1, 0))
    assert failures == [], "seen at the EXIT: #{inspect(Enum.frequencies(failures))}"
  end

  # Heft's transfer message may arrive after the EXIT (Heft moduledoc,
  # differences; test/contract/differences_test.exs).
  contract "the heir's transfer messages are in its mailbox before the owner's EXIT",
    only: :ets do
    queued = m |> heir_rounds(div(@rounds, 2)) |> Enum.flat_map(&elem(&1, 1))

    assert Enum.all?(queued),
           "#{Enum.count(queued, &(!&1))} of #{length(queued)} EXITs came first"
  end

  # A persistent table's owner is killed among others with many tables; at
  # its DOWN the directory opens, with every record, each of 20 rounds.
  contract "the directory of a dead owner's persistent table opens right after its DOWN",
    only: Heft do
    dir = Path.join(System.tmp_dir!(), "heft_owner_exit_#{System.unique_integer([:positive])}")
    me = self()

    outcomes =
      for round <- 1..@rounds do
        s = 1 + rem(round, schedulers())

        {owner, ref} =
          :erlang.spawn_opt(
            fn ->
              # Its last table: the one the VM tells Heft of last.
              for _ <- 1..(25 * @tables_per_owner), do: m.new(:other, [])
              t = m.new(:persisted, persist: dir)
              m.insert(t, {round})
              send(me, {self(), :up})
              receive do: (:never -> :ok)
            end,
            [:monitor, {:scheduler, s}]
          )

        assert_receive {^owner, :up}, 10_000
        # Held by a live owner: refused at once.
        assert Heft.open(dir) == {:error, :locked}
        Process.exit(owner, :kill)
        assert_receive {:DOWN, ^ref, :process, ^owner, :killed}

        case Heft.open(dir) do
          {:ok, t} ->
            records = m.tab2list(t)
            :ok = Heft.close(t)
            length(records) == round

          {:error, reason} ->
            reason
        end
      end

    File.rm_rf!(dir)
    assert Enum.frequencies(outcomes) == %{true => @rounds}
  end
end
