defmodule Heft.SchedulingTest do
  # The normal-scheduler NIFs hand big jobs to dirty schedulers: they answer
  # :"$heft_cpu" (too much work for about a millisecond) or :"$heft_io" (a
  # file-backed table) instead of doing the work. These tests call the NIFs
  # directly to see the routing, then check Heft gets the job done.
  use ExUnit.Case, async: true
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
end
