defmodule Heft.SchedulingTest do
  # The normal-scheduler NIFs hand big jobs to dirty schedulers: they answer
  # :"$heft_cpu" (too much work for about a millisecond) or :"$heft_io" (a
  # file-backed table) instead of doing the work. These tests call the NIFs
  # directly to see the routing, then check Heft gets the job done.
  use ExUnit.Case, async: true
  import Bitwise
  alias Heft.Native

  setup do
    t = Heft.new(:sched, [:public])
    %{t: t, ref: t.ref}
  end

  test "small calls run on the normal scheduler", %{t: t, ref: ref} do
    assert Native.insert(ref, {1, "small"}) == true
    assert Native.lookup(ref, 1) == [{1, "small"}]
    assert Native.insert(ref, for(i <- 1..100, do: {i, i})) == true
    assert Heft.info(t, :size) == 100
  end

  # A scan's chunks run on a normal scheduler, tens of microseconds each:
  # each tells the VM its time, so the scanning process yields as often as
  # it would running as much Erlang code (or ETS's select), and the short
  # calls of other processes on its scheduler do not wait behind all of
  # its chunks. Uncharged, 100,000 records cost the caller a few hundred
  # reductions (the Elixir code between the chunks).
  test "a scan charges its caller reductions for its work, as ETS's does", %{t: t} do
    objects = for k <- 1..100_000, do: {k, rem(k, 7), :binary.copy(<<k::32>>, 8)}
    e = :ets.new(:sched_ets, [:public])
    :ets.insert(e, objects)
    Heft.insert(t, objects)
    spec = [{{:_, :"$1", :_}, [{:<, :"$1", 1}], [true]}]

    for walk <- [&Heft.select_count(t, &1), &Heft.select(t, &1), &Heft.select_delete(t, &1)] do
      assert reductions(fn -> :ets.select_count(e, spec) end) > 100_000
      heft = reductions(fn -> walk.(spec) end)
      assert heft > 20_000, "#{heft} reductions for a walk of 100,000 records"
    end
  end

  defp reductions(fun) do
    {:reductions, before} = Process.info(self(), :reductions)
    fun.()
    {:reductions, later} = Process.info(self(), :reductions)
    later - before
  end

  test "a long list goes to a dirty CPU scheduler", %{t: t, ref: ref} do
    batch = for i <- 1..10_000, do: {i, i}
    assert Native.insert(ref, batch) == :"$heft_cpu"
    assert Heft.info(t, :size) == 0, "the normal call did not half-insert"
    assert Heft.insert(t, batch) == true
    assert Heft.info(t, :size) == 10_000
  end

  test "a very large term goes to a dirty CPU scheduler", %{t: t, ref: ref} do
    big = {:big, Enum.to_list(1..200_000)}
    assert Native.insert(ref, big) == :"$heft_cpu"
    assert Heft.insert(t, big) == true
    assert Native.lookup(ref, :big) == :"$heft_cpu"
    assert Native.take(ref, :big) == :"$heft_cpu"
    assert Heft.lookup(t, :big) == [big]
    assert Native.chunk(ref, :start, 10) == :"$heft_cpu"
    assert Heft.tab2list(t) == [big]
    assert Heft.take(t, :big) == [big]
  end

  test "a huge binary is copied on a dirty scheduler", %{t: t, ref: ref} do
    blob = :binary.copy(<<1, 2, 3, 4>>, 4_000_000)
    assert Native.insert(ref, {:blob, blob}) == :"$heft_cpu"
    assert Heft.insert(t, {:blob, blob})
    assert Heft.lookup_element(t, :blob, 2) == blob
  end

  @tag :tmp_dir
  test "every operation on a file-backed table runs on a dirty I/O scheduler", %{tmp_dir: dir} do
    t = Heft.new(:filed, [:public, arena: {:file, dir}])
    assert Native.insert(t.ref, {1, 2}) == :"$heft_io"
    assert Native.lookup(t.ref, 1) == :"$heft_io"
    assert Native.chunk(t.ref, :start, 10) == :"$heft_io"
    assert Heft.insert(t, {1, 2})
    assert Heft.lookup(t, 1) == [{1, 2}]
    assert Heft.tab2list(t) == [{1, 2}]
  end

  @tag :tmp_dir
  test "delete/1 of a large file arena has removed its file when it returns", %{tmp_dir: dir} do
    # Over 16 MiB: unmapped by a thread after delete/1 returns, yet the
    # file is gone by then (an owner's exit removes it soon after).
    blob = :crypto.strong_rand_bytes(4096)

    for how <- [:delete, :owner_exit] do
      parent = self()

      owner =
        spawn(fn ->
          t = Heft.new(:filed_big, [:public, arena: {:file, dir}, compression: :none])
          Heft.insert(t, for(i <- 1..6_000, do: {i, blob}))
          send(parent, {:table, t})
          receive do: (:go -> :ok)
        end)

      t = receive do: ({:table, t} -> t)
      assert [_] = Path.wildcard(Path.join(dir, "*.arena"))
      assert Heft.info(t, :arena_mapped_bytes) > 16 <<< 20

      case how do
        :delete ->
          true = Heft.delete(t)

        :owner_exit ->
          send(owner, :go)
          assert Heft.Test.Wait.until(fn -> Path.wildcard(Path.join(dir, "*.arena")) == [] end)
          assert Heft.info(t, :size) == :undefined
      end

      assert Path.wildcard(Path.join(dir, "*.arena")) == [], inspect(how)
      Process.exit(owner, :kill)
    end
  end

  # Makes quick calls `native.()` until one answers :"$heft_cpu"; checks that
  # that call changed nothing and that Heft's own call, which goes on to
  # DirtyCpu, makes the change. Returns the quick calls that went through.
  defp until_retried(t, native, heft) do
    Enum.reduce_while(0..1_000_000, 0, fn done, _ ->
      size = Heft.info(t, :size)

      case native.() do
        :"$heft_cpu" ->
          assert Heft.info(t, :size) == size, "the refused call changed nothing"
          heft.()
          assert Heft.info(t, :size) != size
          {:halt, done}

        _ ->
          {:cont, done}
      end
    end)
  end

  @big 40_000

  defp big(kind) do
    t = Heft.new(:big, [kind, :public])
    Heft.insert(t, for(i <- 1..@big, do: {i, i}))
    t
  end

  # Deleting in walk order (survivors at one end of the hash space) used
  # to rebuild the index at every step; a shrink of a large index is still
  # tens of milliseconds at a million keys: never on a normal scheduler.
  for {op, kinds} <- [delete: [:set, :bag], take: [:set], delete_object: [:set, :bag]],
      kind <- kinds do
    test "a #{op} on a #{kind} that would shrink a large index runs on a dirty CPU scheduler" do
      t = big(unquote(kind))
      ref = t.ref

      {native, heft} =
        case unquote(op) do
          :delete ->
            {&Native.delete_key(ref, &1), &Heft.delete(t, &1)}

          :take ->
            {&Native.take(ref, &1), &Heft.take(t, &1)}

          :delete_object ->
            {&Native.delete_object(ref, {&1, &1}), &Heft.delete_object(t, {&1, &1})}
        end

      done = until_retried(t, fn -> native.(Heft.first(t)) end, fn -> heft.(Heft.first(t)) end)
      assert done > 0 and done < @big
    end
  end

  for op <- [:insert, :insert_new, :update_counter] do
    test "an #{op} that would grow a large index runs on a dirty CPU scheduler", %{t: t, ref: ref} do
      i = :counters.new(1, [])
      next = fn -> :counters.get(i, 1) + 1 end

      {native, heft} =
        case unquote(op) do
          :insert ->
            {&Native.insert(ref, {&1, 0}), &Heft.insert(t, {&1, 0})}

          :insert_new ->
            {&Native.insert_new(ref, {&1, 0}), &Heft.insert_new(t, {&1, 0})}

          :update_counter ->
            {&Native.update_counter(ref, &1, {2, 1}, {:default, {&1, 0}}),
             &Heft.update_counter(t, &1, {2, 1}, {&1, 0})}
        end

      quick = fn ->
        r = native.(next.())
        if r != :"$heft_cpu", do: :counters.add(i, 1, 1)
        r
      end

      done = until_retried(t, quick, fn -> heft.(next.()) end)
      assert done > 20_000 and done < @big
      assert Heft.lookup(t, done + 1) != []
    end
  end

  test "a call that meets a long change waits for it on a dirty CPU scheduler", %{t: t, ref: ref} do
    Heft.insert(t, {1, :one})
    holder = Task.async(fn -> Native.debug_hold_lock(ref, 300) end)
    # Until the holder has the lock, the quick call may still get it.
    assert Heft.Test.Wait.until(fn -> Native.lookup(ref, 1) == :"$heft_cpu" end)
    assert Native.insert(ref, {2, :two}) == :"$heft_cpu"
    assert Native.update_counter(ref, 3, {2, 1}, {:default, {3, 0}}) == :"$heft_cpu"
    assert Native.chunk(ref, :start, 10) == :"$heft_cpu"
    assert Heft.lookup(t, 1) == [{1, :one}]
    assert Task.await(holder)
    assert Heft.lookup(t, 2) == [], "the refused insert changed nothing"
    assert Heft.lookup(t, 3) == []
    assert Heft.update_counter(t, 3, {2, 1}, {3, 0}) == 1
    assert Native.insert(ref, {2, :two}) == true
  end

  test "delete/1 and safe_fixtable/2 meeting a long change wait on a dirty scheduler",
       %{t: t, ref: ref} do
    holder = Task.async(fn -> Native.debug_hold_lock(ref, 300) end)
    assert Heft.Test.Wait.until(fn -> Native.lookup(ref, 1) == :"$heft_cpu" end)
    assert Native.safe_fixtable(ref, true, :erlang.monotonic_time()) == :"$heft_cpu"
    assert Native.delete_table(ref) == :"$heft_cpu"
    assert Heft.info(t, :fixed) == false, "the refused calls changed nothing"
    assert Heft.safe_fixtable(t, true)
    assert Heft.info(t, :fixed) == true
    assert Heft.delete(t)
    assert Task.await(holder)
    assert Heft.info(t) == :undefined
  end

  test "delete_all_objects of a large table runs on a dirty CPU scheduler" do
    t = Heft.new(:big, [:public])
    Heft.insert(t, for(i <- 1..@big, do: {i, :crypto.strong_rand_bytes(100)}))
    assert Native.delete_all_objects(t.ref) == :"$heft_cpu"
    assert Heft.info(t, :size) == @big
    assert Heft.delete_all_objects(t)
    assert Heft.info(t, :size) == 0
    assert Native.delete_all_objects(t.ref) == 0
  end
end
