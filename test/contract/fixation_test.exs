defmodule Heft.Contract.FixationTest do
  @moduledoc """
  safe_fixtable/2 and what info/2 says of it (:fixed, :safe_fixed,
  :safe_fixed_monotonic_time), and ETS's guarantee for a fixed table: a
  first/next walk visits every object present for the whole walk exactly
  once while other processes insert and delete, even when the walker
  deletes the key it stands on.
  """
  use Heft.Contract.Case, async: true

  @types [:set, :ordered_set, :bag, :duplicate_bag]

  # Lasting keys stay for the whole walk; fleeting keys are deleted by the
  # writer, which also keeps inserting and deleting new keys.
  @lasting 1..3_000
  @fleeting 100_001..103_000

  contract "a table is not fixed until safe_fixtable(tab, true)" do
    tab = new(m)
    assert m.info(tab, :fixed) == false
    assert m.info(tab, :safe_fixed) == false
    assert m.info(tab, :safe_fixed_monotonic_time) == false
  end

  contract "fixations count per process; the table is fixed until the last is released" do
    tab = new(m)
    before = :erlang.monotonic_time()
    assert m.safe_fixtable(tab, true) == true
    assert m.safe_fixtable(tab, true) == true
    me = self()

    assert {mono, [{^me, 2}]} = m.info(tab, :safe_fixed_monotonic_time)
    assert is_integer(mono) and mono >= before and mono <= :erlang.monotonic_time()
    assert m.info(tab, :fixed) == true

    assert {{mega, sec, micro}, [{^me, 2}]} = m.info(tab, :safe_fixed)
    fixed_us = (mega * 1_000_000 + sec) * 1_000_000 + micro
    expected_us = :erlang.convert_time_unit(mono + :erlang.time_offset(), :native, :microsecond)
    assert abs(fixed_us - expected_us) <= 1_000

    assert m.safe_fixtable(tab, false) == true
    assert {^mono, [{^me, 1}]} = m.info(tab, :safe_fixed_monotonic_time)
    assert m.safe_fixtable(tab, false) == true
    assert m.info(tab, :fixed) == false
    assert m.info(tab, :safe_fixed) == false
    # Releasing more than was fixed changes nothing.
    assert m.safe_fixtable(tab, false) == true
    assert m.info(tab, :fixed) == false
  end

  contract "several fixers: first fixer first, the time of the first fixation stays" do
    tab = new(m, [:public])
    me = self()
    m.safe_fixtable(tab, true)
    {:ok, {mono, _}} = {:ok, m.info(tab, :safe_fixed_monotonic_time)}
    other = start_process()
    {:ok, true} = run_in(other, fn -> m.safe_fixtable(tab, true) end)
    {:ok, true} = run_in(other, fn -> m.safe_fixtable(tab, true) end)
    assert m.info(tab, :safe_fixed_monotonic_time) == {mono, [{me, 1}, {other, 2}]}

    m.safe_fixtable(tab, false)
    assert m.info(tab, :safe_fixed_monotonic_time) == {mono, [{other, 2}]}
    assert m.info(tab, :fixed) == true
    stop(other)
  end

  contract "a process's fixations end when it exits" do
    tab = new(m, [:public])
    other = start_process()
    {:ok, true} = run_in(other, fn -> m.safe_fixtable(tab, true) end)
    assert m.info(tab, :fixed) == true
    stop(other, :kill)
    assert m.info(tab, :fixed) == false
    assert m.info(tab, :safe_fixed) == false

    # A new fixation after that starts a new fixation time.
    before = :erlang.monotonic_time()
    m.safe_fixtable(tab, true)
    assert {mono, [{_, 1}]} = m.info(tab, :safe_fixed_monotonic_time)
    assert mono >= before
  end

  contract "a protected table can be fixed by any process, a private one by its owner only" do
    protected = new(m)
    assert {:ok, true} = in_other_process(fn -> m.safe_fixtable(protected, true) end)
    private = new(m, [:private])
    assert {:raise, ArgumentError} = in_other_process(fn -> m.safe_fixtable(private, true) end)
    assert m.safe_fixtable(private, true) == true
  end

  contract "safe_fixtable raises ArgumentError for a non-boolean or a missing table" do
    tab = new(m)
    assert_raise ArgumentError, fn -> m.safe_fixtable(tab, :yes) end
    assert_raise ArgumentError, fn -> m.safe_fixtable(unique_name(), true) end
    m.delete(tab)
    assert_raise ArgumentError, fn -> m.safe_fixtable(tab, true) end
    assert m.info(tab, :fixed) == :undefined
  end

  contract "on a fixed set, next/2 of the key just deleted goes on with the walk" do
    tab = new_with(m, for(i <- 1..2_000, do: {i}))
    m.safe_fixtable(tab, true)

    visited = traversal_with(m, tab, &m.delete(tab, &1))
    m.safe_fixtable(tab, false)
    assert Enum.sort(visited) == Enum.to_list(1..2_000)
    assert m.tab2list(tab) == []
  end

  for type <- @types do
    contract "#{type}: a fixed walk sees every lasting key once while another process writes",
      type: type do
      # The walker deletes every third lasting key itself, standing on it.
      visited =
        walk_while_writing(m, unquote(type), fn tab, others_write ->
          traversal_with(m, tab, fn key ->
            if is_integer(key) and key in @lasting and rem(key, 3) == 0, do: m.delete(tab, key)
            others_write.()
          end)
        end)

      counts = Enum.frequencies(visited)
      assert Enum.filter(counts, fn {_, n} -> n > 1 end) == []
      assert Enum.reject(@lasting, &Map.has_key?(counts, &1)) == []
    end
  end

  for type <- [:set, :bag, :duplicate_bag] do
    contract "#{type}: a fixed table's slots hold every lasting object once while another process writes",
      type: type do
      type = unquote(type)
      seen = walk_while_writing(m, type, &slots_while(m, &1, &2, 0, []))
      assert Enum.filter(Enum.frequencies(seen), fn {_, n} -> n > 1 end) == []
      assert Enum.flat_map(@lasting, &objects_of(type, &1)) -- seen == []
    end
  end

  defp objects_of(type, k) when type in [:bag, :duplicate_bag], do: [{k, :a}, {k, :b}]
  defp objects_of(_type, k), do: [{k, :a}]

  # Runs `walk.(tab, others_write)` on a fixed table of `type` holding the
  # lasting and fleeting keys' objects; each call of `others_write.()` has
  # another process make @writes_per_step writes (see writer/4) and waits
  # for them. Returns what the walk returned.
  @writes_per_step 3

  defp walk_while_writing(m, type, walk) do
    tab = new(m, [type, :public])
    m.insert(tab, Enum.flat_map(Enum.concat(@lasting, @fleeting), &objects_of(type, &1)))
    m.safe_fixtable(tab, true)
    writer = spawn_link(fn -> writer(m, tab, Enum.to_list(@fleeting), 0) end)

    others_write = fn ->
      send(writer, {:write, self()})
      assert_receive {:wrote, ^writer}, 5_000
    end

    walked = walk.(tab, others_write)
    ref = Process.monitor(writer)
    send(writer, {:stop, self()})
    assert_receive {:DOWN, ^ref, :process, _, _}
    m.safe_fixtable(tab, false)
    walked
  end

  # The objects of slots i, i + 1, ... until :"$end_of_table", with
  # others writing between slots.
  defp slots_while(m, tab, others_write, i, acc) do
    case m.slot(tab, i) do
      :"$end_of_table" ->
        Enum.concat(Enum.reverse(acc))

      objects ->
        others_write.()
        slots_while(m, tab, others_write, i + 1, [objects | acc])
    end
  end

  # On each request, makes @writes_per_step writes: deletes the next
  # fleeting key, and inserts the next of 9,000 new keys (growing the table
  # past twice its size, so a hash index rebuilds), then deletes them all
  # again, over and over. New keys are floats between the lasting integers:
  # a bounded set spread over the walk's order, so the walk cannot chase
  # them forever.
  @new_keys 9_000

  defp writer(m, tab, fleeting, writes) do
    receive do
      {:write, from} ->
        fleeting =
          Enum.reduce(1..@writes_per_step, fleeting, fn i, fleeting ->
            case rem(writes + i, 2 * @new_keys) do
              n when n < @new_keys -> m.insert(tab, {new_key(n), :new})
              n -> m.delete(tab, new_key(n - @new_keys))
            end

            case fleeting do
              [k | rest] ->
                m.delete(tab, k)
                rest

              [] ->
                []
            end
          end)

        send(from, {:wrote, self()})
        writer(m, tab, fleeting, writes + @writes_per_step)

      {:stop, _from} ->
        :ok
    end
  end

  defp new_key(n), do: rem(n, 3_000) + 0.25 * (1 + div(n, 3_000))
end
