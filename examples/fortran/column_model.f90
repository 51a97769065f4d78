! A Fortran column model under MPI, corrected by a learnt policy through libembodyrl_link.
!
!   cmake -S hal/coupling/c -B build && cmake --build build
!   mpifort.mpich -O2 -Ibuild -o column_model examples/fortran/column_model.f90 -Lbuild -lembodyrl_link
!   embodyrl learner coupling --config examples/fortran/column_model.yaml     # prints endpoint, policy
!   mpiexec.mpich -n 4 ./column_model STEPS COLUMNS OUT_DIR "policy=P.msgpack learner=ENDPOINT" [STEP_MS]
!
! Each rank owns COLUMNS / ranks columns of 20 levels. The truth relaxes every level toward an
! equilibrium profile with an equator-pole contrast of 40 K in 3 days; the model believes 48 K and
! 2 days, so its tendency is wrong by an amount that depends on the state and the latitude. The
! target each step is that error (truth tendency minus model tendency at the model's state, K/day);
! the link streams it with the model's state and answers the correction the model applies. Rank 0
! prints the mean absolute error against the truth every 50 steps (an MPI reduction); each rank
! writes its last step's state, context and correction to OUT_DIR/rankR.f32 (the parity check).
! STEP_MS: a pause per step standing in for a real model's physics (this one's takes microseconds).
! The configuration "none" runs the model without the link (no correction): the baseline.
program column_model
  use, intrinsic :: iso_c_binding
  use mpi
  use embodyrl_link
  implicit none
  integer, parameter :: levels = 20, features = 2, ncontext = 1
  real(c_float), parameter :: dt_days = 1.0 / 24.0, max_correction = 5.0
  type(link_handle) :: link
  real(c_float), allocatable :: state(:, :, :), context(:, :), increment(:, :), correction(:, :)
  real(c_float), allocatable :: theta(:, :), truth(:, :), lat(:)
  integer :: rank, ranks, ierr, columns, mine, first, steps, t, j, k, status, zeros, unit, step_ms
  double precision :: started
  logical :: coupled
  real(c_float) :: error, total
  character(len=512) :: arg, out_dir, config
  character(len=16) :: rank_text

  call MPI_Init(ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  call MPI_Comm_size(MPI_COMM_WORLD, ranks, ierr)
  call get_command_argument(1, arg); read (arg, *) steps
  call get_command_argument(2, arg); read (arg, *) columns
  call get_command_argument(3, out_dir)
  call get_command_argument(4, config)
  step_ms = 0
  if (command_argument_count() >= 5) then
    call get_command_argument(5, arg); read (arg, *) step_ms
  end if
  mine = columns / ranks
  first = rank * mine
  if (rank == ranks - 1) mine = columns - first
  allocate (state(features, levels, mine), context(ncontext, mine), increment(levels, mine))
  allocate (correction(levels, mine), theta(levels, mine), truth(levels, mine), lat(mine))
  do j = 1, mine
    lat(j) = -1.4 + 2.8 * real(first + j - 1) / real(max(columns - 1, 1))
    context(1, j) = sin(lat(j))
    do k = 1, levels
      theta(k, j) = equilibrium(40.0, lat(j), k)
    end do
  end do
  truth = theta

  write (rank_text, '(i0)') rank
  coupled = trim(config) /= 'none'
  correction = 0.0
  if (coupled) then
    call link_open(link, trim(config) // " levels=20 features=2 context=1 radius=1 max_correction=5 rank=" &
                   // trim(rank_text))
    if (.not. link_opened(link)) call MPI_Abort(MPI_COMM_WORLD, 1, ierr)
  end if
  zeros = 0
  do t = 1, steps
    do j = 1, mine
      do k = 1, levels
        state(1, k, j) = (theta(k, j) - 250.0) / 50.0
        state(2, k, j) = tendency(48.0, 2.0, lat(j), k, theta(k, j)) / 10.0
        increment(k, j) = tendency(40.0, 3.0, lat(j), k, theta(k, j)) - tendency(48.0, 2.0, lat(j), k, theta(k, j))
      end do
    end do
    if (coupled) then
      status = link_exchange(link, state, correction, context=context, target_increment=increment)
      if (status /= 0) zeros = zeros + 1
    end if
    started = MPI_Wtime()
    do while (MPI_Wtime() - started < 1d-3 * step_ms)
    end do
    do j = 1, mine
      do k = 1, levels
        theta(k, j) = theta(k, j) + dt_days * (tendency(48.0, 2.0, lat(j), k, theta(k, j)) + correction(k, j))
        truth(k, j) = truth(k, j) + dt_days * tendency(40.0, 3.0, lat(j), k, truth(k, j))
      end do
    end do
    if (mod(t, 50) == 0 .or. t == steps) then
      error = sum(abs(theta - truth))
      call MPI_Reduce(error, total, 1, MPI_REAL, MPI_SUM, 0, MPI_COMM_WORLD, ierr)
      if (rank == 0) print '(a, i0, a, f10.4, a, i0)', 'step ', t, ' mean |theta - truth| K ', &
          total / real(columns * levels), ' zero answers on rank 0 ', zeros
    end if
  end do
  open (newunit=unit, file=trim(out_dir) // '/rank' // trim(rank_text) // '.f32', access='stream', &
        form='unformatted', status='replace')
  write (unit) state, context, correction
  close (unit)
  if (coupled) call link_close(link)
  call MPI_Finalize(ierr)

contains

  real(c_float) function equilibrium(contrast, phi, k)
    real(c_float), intent(in) :: contrast, phi
    integer, intent(in) :: k
    equilibrium = 300.0 - contrast * sin(phi)**2 + 2.0 * real(k - 1)
  end function

  ! K/day: relaxation toward the equilibrium of `contrast` in `tau` days, faster near the ground
  real(c_float) function tendency(contrast, tau, phi, k, value)
    real(c_float), intent(in) :: contrast, tau, phi, value
    integer, intent(in) :: k
    tendency = (equilibrium(contrast, phi, k) - value) / (tau * (1.0 + real(k - 1) / real(levels)))
  end function

end program column_model
