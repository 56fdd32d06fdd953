defmodule Heft.AtomIdsTest do
  @moduledoc """
  Each table numbers atoms in the order it first meets them, and the
  encoder keeps a per-thread cache of atom ids by table
  (native/heft_nif/src/resource.rs, `SEEN`). Tables that give the same
  atoms different ids, written in turn from one process (one scheduler
  thread), each read back their own atoms.
  """
  use ExUnit.Case, async: true

  @atoms for i <- 1..200, do: :"atom_ids_test_#{i}"

  defp fill(t, atoms) do
    for {a, i} <- Enum.with_index(atoms), do: Heft.insert(t, {i, a, [a]})
  end

  defp check(t, atoms) do
    for {a, i} <- Enum.with_index(atoms), do: assert(Heft.lookup(t, i) == [{i, a, [a]}])
  end

  test "tables numbering the same atoms differently, written in turn, read back their own" do
    n = length(@atoms)
    # 130 tables made in a row, each meeting the atoms first in its own
    # rotation, so each gives them other ids. The cache's slots mix a
    # table's number in: tables 64 apart share slots.
    tabs =
      for r <- 0..129 do
        {front, back} = Enum.split(@atoms, rem(r * 37, n))
        order = back ++ front
        t = Heft.new(:atom_ids, [])
        fill(t, order)
        {t, order}
      end

    for {t, order} <- tabs, do: check(t, order)

    # Each atom written to every table in turn: an entry a table leaves
    # in its slot is met by the next table sharing that slot, before any
    # other table writes that atom there.
    for {a, k} <- Enum.with_index(@atoms), {t, _} <- tabs, do: Heft.insert(t, {n + k, a})

    for {a, k} <- Enum.with_index(@atoms),
        {t, _} <- tabs,
        do: assert(Heft.lookup(t, n + k) == [{n + k, a}])

    for {t, order} <- tabs, do: check(t, order)
    for {t, _} <- tabs, do: Heft.delete(t)
  end
end
