! The Fortran side of libembodyrl_link (iso_c_binding): a model rank's coupling link.
!
!   use embodyrl_link
!   type(link_handle) :: link
!   call link_open(link, "levels=70 features=3 rank=0 policy=policy.msgpack learner=tcp://host:5555")
!   status = link_exchange(link, state, correction, target_increment=increment)   ! every step
!   call link_close(link)
!
! state(features, levels, columns), context(context, columns), target_increment(levels, columns)
! and correction(levels, columns) are real(c_float), contiguous: the C library's row-major
! [columns][levels][features] is the same bytes. The configuration words are those of
! link_config in embodyrl_link.h.
module embodyrl_link
  use, intrinsic :: iso_c_binding
  implicit none
  private
  public :: link_handle, link_open, link_exchange, link_close, link_opened

  type :: link_handle
    type(c_ptr) :: ptr = c_null_ptr
  end type

  interface
    function c_link_open_text(text) bind(C, name="link_open_text") result(link)
      import :: c_ptr, c_char
      character(kind=c_char), dimension(*), intent(in) :: text
      type(c_ptr) :: link
    end function
    function c_link_exchange(link, columns, state, context, target, correction) &
        bind(C, name="link_exchange") result(status)
      import :: c_ptr, c_int
      type(c_ptr), value :: link, state, context, target, correction
      integer(c_int), value :: columns
      integer(c_int) :: status
    end function
    subroutine c_link_close(link, flush_s) bind(C, name="link_close")
      import :: c_ptr, c_double
      type(c_ptr), value :: link
      real(c_double), value :: flush_s
    end subroutine
  end interface

contains

  subroutine link_open(link, config)
    type(link_handle), intent(out) :: link
    character(len=*), intent(in) :: config
    link%ptr = c_link_open_text(trim(config) // c_null_char)
  end subroutine

  logical function link_opened(link)
    type(link_handle), intent(in) :: link
    link_opened = c_associated(link%ptr)
  end function

  ! 0: corrections from the policy; 1: zeros (no weights yet, learner lost); -1: bad input or no link.
  integer function link_exchange(link, state, correction, context, target_increment)
    type(link_handle), intent(in) :: link
    real(c_float), intent(in), target, contiguous :: state(:, :, :)
    real(c_float), intent(out), target, contiguous :: correction(:, :)
    real(c_float), intent(in), target, contiguous, optional :: context(:, :), target_increment(:, :)
    type(c_ptr) :: context_ptr, target_ptr
    context_ptr = c_null_ptr
    target_ptr = c_null_ptr
    if (present(context)) context_ptr = c_loc(context)
    if (present(target_increment)) target_ptr = c_loc(target_increment)
    correction = 0.0_c_float
    link_exchange = c_link_exchange(link%ptr, int(size(state, 3), c_int), c_loc(state), context_ptr, &
                                    target_ptr, c_loc(correction))
  end function

  subroutine link_close(link, flush_s)
    type(link_handle), intent(inout) :: link
    real(c_double), intent(in), optional :: flush_s
    real(c_double) :: wait_s
    wait_s = 5.0_c_double
    if (present(flush_s)) wait_s = flush_s
    if (c_associated(link%ptr)) call c_link_close(link%ptr, wait_s)
    link%ptr = c_null_ptr
  end subroutine

end module embodyrl_link
